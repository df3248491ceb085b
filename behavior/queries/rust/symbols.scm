; Rust definitions. Attributes (#[derive(...)]) and doc comments are siblings
; before the item: replace_declaration keeps them. An impl block is named
; "impl <Type>"; the functions in it have the type as their container.

(function_item
  name: (identifier) @name
  body: (block) @body) @definition.function

(function_signature_item
  name: (identifier) @name) @definition.function

(struct_item
  name: (type_identifier) @name
  body: (_) @body) @definition.struct

(struct_item
  name: (type_identifier) @name) @definition.struct

(enum_item
  name: (type_identifier) @name
  body: (enum_variant_list) @body) @definition.enum

(union_item
  name: (type_identifier) @name
  body: (field_declaration_list) @body) @definition.union

(trait_item
  name: (type_identifier) @name
  body: (declaration_list) @body) @definition.trait

(impl_item
  type: (_) @name
  body: (declaration_list) @body) @definition.impl

(mod_item
  name: (identifier) @name
  body: (declaration_list) @body) @definition.module

(type_item
  name: (type_identifier) @name) @definition.type

(const_item
  name: (identifier) @name) @definition.constant

(static_item
  name: (identifier) @name) @definition.variable

(macro_definition
  name: (identifier) @name) @definition.macro
