"""What several test modules share that is not a fixture (fixtures are in tests/conftest.py): data
written in each benchmark's real schema, a judge server, the presets' stand-ins."""
