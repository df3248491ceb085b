(call_expression
  function: [
    (identifier) @name
    (selector_expression field: (field_identifier) @name)
  ]) @reference.call

(type_identifier) @name @reference.type

(field_identifier) @name @reference.field

(identifier) @name @reference.name
