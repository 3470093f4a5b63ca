"""Named, versioned resources (verifiers, environments): one implementation of create, list,
get, versions and the pin a job takes at submission. Each domain brings its table, its
schemas and its config check; the registry brings the rest."""
