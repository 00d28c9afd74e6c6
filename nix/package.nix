{ lib, python3Packages, llama-cpp }:

python3Packages.buildPythonApplication {
  pname = "llama-router";
  # One version for every install path: the one pyproject.toml gives the wheel.
  version = (builtins.fromTOML (builtins.readFile ../pyproject.toml)).project.version;
  pyproject = true;
  src = lib.cleanSource ../.;

  build-system = [ python3Packages.setuptools ];
  dependencies = with python3Packages; [
    attrs pyrsistent trio hypercorn quart-trio httpx httptools pynvml gguf prometheus-client
  ];

  # The router finds llama-server on PATH unless the config names a binary.
  makeWrapperArgs = [ "--suffix" "PATH" ":" "${lib.getBin llama-cpp}/bin" ];

  doCheck = false; # the test suite builds and runs llama-server; run scripts/test in the dev shell

  meta = {
    description = "One OpenAI-compatible endpoint in front of llama.cpp's llama-server";
    license = lib.licenses.mit;
    mainProgram = "llama-router";
    platforms = lib.platforms.linux;
  };
}
