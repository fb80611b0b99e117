"""Running a decode: the generation loop, and the backends that execute a step."""
