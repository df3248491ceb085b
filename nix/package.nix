# The klbr suite as one package: klbr-core (daemon and operator CLI),
# klbr-kernel (the contained-process launcher), klbr-discord once it exists,
# the systemd units from nix/systemd, and the Grafana dashboard.
#
# The Python runtime (python/klbr-runtime) and the default behavior tree
# (behavior/) are embedded in klbr-core with go:embed and materialized under
# the data directory at start (DESIGN.md §8), so the binary is the whole
# install: nothing of them is copied here. klbr-core is wrapped with a pinned
# interpreter on KLBR_PYTHON (a default: the service or the shell can still
# point it elsewhere).
{
  lib,
  buildGo126Module,
  makeBinaryWrapper,
  python3,
  git,
  version ? "0.0.0-dev",
}:

let
  # The pinned interpreter, with pip: a release that declares dependencies
  # (dependencies.json) has them staged under it before activation, with
  # pip --no-index from <data>/wheels only (docs/operating.md).
  python = python3.withPackages (ps: [ ps.pip ]);

  # The source: the whole repository minus build output. go.mod, go.sum,
  # every Go package and everything go:embed reaches must be in it. It must
  # hold every Go file `go mod vendor` sees in a checkout, or the vendored
  # tree, and so vendorHash, would differ from the one nix/vendorhash_test.go
  # computes.
  src = lib.cleanSourceWith {
    name = "klbr-source";
    src = lib.cleanSource ../.;
    filter =
      path: type:
      let
        rel = lib.removePrefix (toString ../. + "/") (toString path);
      in
      !(
        rel == "bin"
        || rel == "result"
        || lib.hasPrefix ".klbr-data" rel
        || lib.hasSuffix ".test" rel
        || lib.hasSuffix ".out" rel
        || baseNameOf rel == "__pycache__"
      );
  };

  hasDiscord = builtins.pathExists ../cmd/klbr-discord;
in
buildGo126Module {
  pname = "klbr";
  inherit version src;

  # The NAR hash of `go mod vendor`'s output for this go.mod and go.sum.
  # nix/vendorhash_test.go recomputes it on every `make test` and prints the
  # new value when a dependency (or an import) changes; nix prints it too, as
  # "got: sha256-…", on the first build after such a change.
  vendorHash = "sha256-3EXyv4cAcGCujPlUSOGWFotaOmofRV8Y/Qte9O8QqqA=";

  # `go mod vendor` copies only each package's own directory, but the
  # tree-sitter cgo packages (the grammars klbr.code parses with) include C
  # sources from elsewhere in their modules: copy those into the vendor tree
  # (part of vendorHash; nix/vendorhash_test.go runs the same script).
  modPostBuild = ''
    bash ${./vendor-cgo.sh} vendor
  '';

  subPackages = [
    "cmd/klbr-core"
    "cmd/klbr-kernel"
  ]
  ++ lib.optional hasDiscord "cmd/klbr-discord";

  # cgo for mattn/go-sqlite3, which bundles SQLite 3.54.1 with the WAL-reset
  # fix. Never build with the libsqlite3 tag: it links the system SQLite,
  # and klbr-core refuses one without the fix (DESIGN.md §3).
  env.CGO_ENABLED = "1";

  # FTS5, for history search: compiled into the bundled SQLite only with
  # this tag (the Makefile and CI build with it too).
  tags = [ "sqlite_fts5" ];

  ldflags = [
    "-s"
    "-w"
    "-X github.com/klbr-dev/klbr/internal/version.Version=${version}"
  ];

  # The Go tests run real daemons, Python workers and a systemd in a
  # namespace; they run in `make test` and CI. The flake's checks build this
  # package and run the NixOS VM test (nix/test.nix) against it.
  doCheck = false;

  nativeBuildInputs = [ makeBinaryWrapper ];

  postInstall = ''
    # The unit files are the repository's, one source of truth (DESIGN.md §7):
    # only the binary paths change, to this package's.
    mkdir -p $out/lib/systemd/system
    for unit in ${./systemd}/*; do
      case "$unit" in
        *.service|*.socket|*.slice|*.target|*.timer|*.path) ;;
        *) continue ;;
      esac
      dest=$out/lib/systemd/system/$(basename "$unit")
      sed -E "s#(/usr(/local)?/s?bin|/opt/klbr/bin)/(klbr-[a-z]+)#$out/bin/\3#g" "$unit" > "$dest"
      chmod 0644 "$dest"
      if grep -nE '(/usr(/local)?/s?bin|/opt/klbr/bin)/klbr-' "$dest"; then
        echo "$dest: a klbr binary path was not rewritten" >&2
        exit 1
      fi
    done
    for unit in klbr-core.socket klbr-core.service klbr.slice; do
      if [ ! -e "$out/lib/systemd/system/$unit" ]; then
        echo "nix/systemd/$unit is missing" >&2
        exit 1
      fi
    done
    if ! grep -q "$out/bin/klbr-core" $out/lib/systemd/system/klbr-core.service; then
      echo "klbr-core.service does not run $out/bin/klbr-core" >&2
      exit 1
    fi

    install -Dm0644 ${./grafana/klbr.json} $out/share/klbr/grafana/klbr.json
    install -Dm0644 ${./prometheus/klbr-rules.yml} $out/share/klbr/prometheus/klbr-rules.yml

    # klbr-core finds klbr-kernel beside its own executable, which stays in
    # $out/bin under the wrapper's name. Drafts are git working trees: the
    # host runs git for behavior.diff, behavior.rebase and `releases diff`.
    wrapProgram $out/bin/klbr-core \
      --set-default KLBR_PYTHON ${python.interpreter} \
      --suffix PATH : ${lib.makeBinPath [ git ]}
  '';

  passthru = {
    inherit python;
    inherit hasDiscord;
  };

  meta = {
    description = "A persistent, self-improving personal agent run as a systemd service suite";
    homepage = "https://github.com/klbr-dev/klbr";
    mainProgram = "klbr-core";
    platforms = lib.platforms.linux;
  };
}
