"""The signed .kbp bundle: canonical zip container (`zipfmt`), manifest and signature members
(`manifest`), keys and keyrings (`keys`), writing/verifying/re-signing (`container`), and the
`keygen` / `sign` / `verify` commands (`commands`)."""
