{
  description = "llama-router: one OpenAI-compatible endpoint in front of llama.cpp's llama-server";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      packages = forAll (pkgs: rec {
        llama-router = pkgs.callPackage ./nix/package.nix { };
        default = llama-router;
      });

      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python3.withPackages (ps: with ps; [
              attrs pyrsistent trio hypercorn quart-trio httpx pynvml gguf prometheus-client
              pytest pytest-trio hypothesis openai anthropic
            ]))
            pkgs.ruff
            pkgs.llama-cpp
            pkgs.cmake
          ];
        };
      });

      nixosModules.default = import ./nix/module.nix self;
    };
}
