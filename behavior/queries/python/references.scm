(call
  function: [
    (identifier) @name
    (attribute attribute: (identifier) @name)
  ]) @reference.call

(class_definition
  superclasses: (argument_list (identifier) @name)) @reference.class

(attribute attribute: (identifier) @name) @reference.attribute

(identifier) @name @reference.name
