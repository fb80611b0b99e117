# Sourced by the scripts/gpu-*.sh device scripts: installs the wheels carried in .whl/ (PyCUDA, lark,
# cryptography and their dependencies are not on the GPU image) into $HOME/site, puts them and this
# checkout on PYTHONPATH, and sets the cubin cache of the GPU tests and the keyring the bundles
# were signed with ($TRUST).
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl 2>&1 | tail -2
    export PYTHONPATH="$HOME/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export KBPC_TEST_CUBIN_CACHE="${KBPC_TEST_CUBIN_CACHE:-/tmp/kbpc-cubins}"
TRUST="--trust out/keys/signing-key.pub.json"
