"""One module per `mf` sub-command (see `mf_cli.main`)."""
