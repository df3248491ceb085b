; TSX definitions (the TypeScript grammar with JSX). An exported one's declaration includes "export".

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

(function_signature
  name: (identifier) @name) @definition.function

(export_statement
  declaration: [
    (class_declaration name: (type_identifier) @name body: (class_body) @body)
    (abstract_class_declaration name: (type_identifier) @name body: (class_body) @body)
  ]) @definition.class

(class_declaration
  name: (type_identifier) @name
  body: (class_body) @body) @definition.class

(abstract_class_declaration
  name: (type_identifier) @name
  body: (class_body) @body) @definition.class

(method_definition
  name: [(property_identifier) (private_property_identifier)] @name
  body: (statement_block) @body) @definition.method

(method_signature
  name: (property_identifier) @name) @definition.method

(abstract_method_signature
  name: (property_identifier) @name) @definition.method

(export_statement
  declaration: (interface_declaration
    name: (type_identifier) @name
    body: (interface_body) @body)) @definition.interface

(interface_declaration
  name: (type_identifier) @name
  body: (interface_body) @body) @definition.interface

(export_statement
  declaration: (type_alias_declaration
    name: (type_identifier) @name)) @definition.type

(type_alias_declaration
  name: (type_identifier) @name) @definition.type

(export_statement
  declaration: (enum_declaration
    name: (identifier) @name
    body: (enum_body) @body)) @definition.enum

(enum_declaration
  name: (identifier) @name
  body: (enum_body) @body) @definition.enum

(internal_module
  name: (_) @name
  body: (statement_block) @body) @definition.module

; Top-level constants and variables; one holding a function is a function.
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
  (lexical_declaration
    (variable_declarator
      name: (identifier) @name)) @definition.variable)
