{
  description = "klbr: a persistent, self-improving personal agent run as a systemd service suite";

  # flake.lock pins a nixos-unstable revision whose go_1_26 satisfies go.mod
  # (go 1.26.0); see docs/deploy.md for where the pin came from and how to
  # move it.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      # klbr is a systemd suite: Linux only.
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      version = "0.1.0+${self.shortRev or self.dirtyShortRev or "dirty"}";
    in
    {
      packages = forAllSystems (pkgs: rec {
        klbr = pkgs.callPackage ./nix/package.nix { inherit version; };
        default = klbr;
      });

      overlays.default = final: _prev: {
        klbr = final.callPackage ./nix/package.nix { inherit version; };
      };

      # services.klbr, with the package defaulting to this flake's build.
      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./nix/module.nix ];
          services.klbr.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        };
      nixosModules.klbr = self.nixosModules.default;

      # services.klbr-worker: a worker host klbr-core reaches over SSH
      # (docs/hosts.md), with the package defaulting to this flake's build.
      nixosModules.worker =
        { lib, pkgs, ... }:
        {
          imports = [ ./nix/worker.nix ];
          services.klbr-worker.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        };

      # services.klbr for Home Manager: klbr-core (and klbr-discord) as
      # systemd user services, on a machine one does not administer
      # (docs/deploy.md, "Without root: Home Manager"). Same settings as
      # nixosModules.default.
      homeManagerModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./nix/home.nix ];
          services.klbr.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        };
      homeManagerModules.klbr = self.homeManagerModules.default;

      checks = forAllSystems (pkgs: {
        # The build: go build with the vendored modules, units installed,
        # klbr-core wrapped with the pinned Python.
        package = self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        # A NixOS VM: socket activation, send and tail through the CLI,
        # /metrics, a workbench in its scope, and a drain on systemctl stop.
        vm = pkgs.testers.runNixOSTest (import ./nix/test.nix { inherit self; });
      });

      # What `make test` needs: Go (at least go.mod's), gcc for cgo (the
      # bundled SQLite), Python 3.11+ for the worker runtime, sqlite3 to look
      # at a data directory.
      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            pkgs.go_1_26
            pkgs.gcc
            pkgs.gnumake
            pkgs.git
            pkgs.python3
            pkgs.sqlite
          ];
          env.CGO_ENABLED = "1";
        };
      });
    };
}
