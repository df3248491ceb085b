; Go definitions. A method's container is its receiver's type.

(function_declaration
  name: (identifier) @name
  body: (block) @body) @definition.function

(method_declaration
  receiver: (parameter_list
    (parameter_declaration
      type: [
        (type_identifier) @container
        (pointer_type (type_identifier) @container)
        (generic_type type: (type_identifier) @container)
        (pointer_type (generic_type type: (type_identifier) @container))
      ]))
  name: (field_identifier) @name
  body: (block) @body) @definition.method

(type_declaration
  (type_spec
    name: (type_identifier) @name
    type: (struct_type) @body)) @definition.struct

(type_declaration
  (type_spec
    name: (type_identifier) @name
    type: (interface_type) @body)) @definition.interface

(type_declaration
  (type_spec
    name: (type_identifier) @name)) @definition.type

(type_declaration
  (type_alias
    name: (type_identifier) @name)) @definition.type

(source_file
  (const_declaration
    (const_spec
      name: (identifier) @name)) @definition.constant)

(source_file
  (var_declaration
    (var_spec
      name: (identifier) @name)) @definition.variable)
