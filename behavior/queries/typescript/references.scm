(call_expression
  function: [
    (identifier) @name
    (member_expression property: (property_identifier) @name)
  ]) @reference.call

(new_expression
  constructor: (identifier) @name) @reference.class

(type_identifier) @name @reference.type

(property_identifier) @name @reference.property

(identifier) @name @reference.name
