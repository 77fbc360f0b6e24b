"""A real Slurm cluster for tests: ``setup.sh`` installs it, :mod:`.cluster` runs it,
:mod:`.fixtures` hands it to pytest."""
