"""One module per ``gac`` sub-command (see :mod:`gac.cli`)."""
