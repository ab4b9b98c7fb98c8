"""One module per `flopwatch` subcommand: argument definitions and the handler."""
