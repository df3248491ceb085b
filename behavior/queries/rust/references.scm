(call_expression
  function: [
    (identifier) @name
    (field_expression field: (field_identifier) @name)
    (scoped_identifier name: (identifier) @name)
  ]) @reference.call

(macro_invocation macro: (identifier) @name) @reference.macro

(type_identifier) @name @reference.type

(field_identifier) @name @reference.field

(identifier) @name @reference.name
