; Nix bindings: "name = value;" in an attribute set or a let. The name is
; the whole attribute path ("services.klbr.enable"); a binding inside
; another binding's set has it as its container.

(binding
  attrpath: (attrpath) @name
  expression: (function_expression
    body: (_) @body)) @definition.function

(binding
  attrpath: (attrpath) @name
  expression: [(attrset_expression) (rec_attrset_expression)] @body) @definition.attrset

(binding
  attrpath: (attrpath) @name) @definition.binding
