"""Training recipes, one per file; each file's get_config(arg) returns a ConfigDict."""
