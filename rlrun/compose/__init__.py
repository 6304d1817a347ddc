"""From a command line to typed configs, above algos/ and envs/ (whose spaces and schemas it checks against): Hydra's
composition and glue, the pre-flight checks, the presets a run gets, and the resume merge. config/ holds the schemas
it converts to and imports nothing of rlrun above errors."""
