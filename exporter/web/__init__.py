"""HTTP: the routes that serve what the pipeline last published."""
