"""One module per subcommand; each parses, calls the library, and renders."""
