"""Machine specs (YAML): the format and its loaders (:mod:`.load`), what a spec may hold
(:mod:`.schema`), the builder (:mod:`.build`), YAML with line numbers (:mod:`.yamlread`),
and the specs shipped with the planner (:mod:`.bundled`)."""
