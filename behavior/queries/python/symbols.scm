; Python definitions. A decorated definition's declaration includes its decorators.

(decorated_definition
  definition: (function_definition
    name: (identifier) @name
    body: (block) @body)) @definition.function

(function_definition
  name: (identifier) @name
  body: (block) @body) @definition.function

(decorated_definition
  definition: (class_definition
    name: (identifier) @name
    body: (block) @body)) @definition.class

(class_definition
  name: (identifier) @name
  body: (block) @body) @definition.class

; Module-level names: constants and globals.
(module
  (expression_statement
    (assignment
      left: (identifier) @name)) @definition.variable)
