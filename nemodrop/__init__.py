"""nemotron-droplet's user tools: one command, `nemodrop`, and a module per subcommand."""
