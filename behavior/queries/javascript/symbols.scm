; JavaScript definitions. An exported one's declaration includes "export".

(export_statement
  declaration: (function_declaration
    name: (identifier) @name
    body: (statement_block) @body)) @definition.function

(function_declaration
  name: (identifier) @name
  body: (statement_block) @body) @definition.function

(generator_function_declaration
  name: (identifier) @name
  body: (statement_block) @body) @definition.function

(export_statement
  declaration: (class_declaration
    name: (identifier) @name
    body: (class_body) @body)) @definition.class

(class_declaration
  name: (identifier) @name
  body: (class_body) @body) @definition.class

(method_definition
  name: [(property_identifier) (private_property_identifier)] @name
  body: (statement_block) @body) @definition.method

(export_statement
  declaration: (lexical_declaration
    (variable_declarator
      name: (identifier) @name
      value: [(arrow_function body: (_) @body) (function_expression body: (_) @body)]))) @definition.function

(program
  (lexical_declaration
    (variable_declarator
      name: (identifier) @name
      value: [(arrow_function body: (_) @body) (function_expression body: (_) @body)])) @definition.function)

(export_statement
  declaration: (lexical_declaration
    (variable_declarator
      name: (identifier) @name))) @definition.variable

(program
  [(lexical_declaration (variable_declarator name: (identifier) @name))
   (variable_declaration (variable_declarator name: (identifier) @name))] @definition.variable)
