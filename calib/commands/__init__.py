"""One module per ``calib`` subcommand (see calib.cli.COMMANDS)."""
