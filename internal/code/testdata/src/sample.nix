# Größe
{ pkgs, lib, ... }:
let
  greet = name: "héllo ${name}";
  version = "1.0";
in
{
  packages.default = pkgs.hello;
  services.klbr = {
    enable = true;
    port = 8080;
  };
  mkGreeting = who: greet who;
}
