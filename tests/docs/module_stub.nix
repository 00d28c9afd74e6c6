# Evaluates nix/module.nix without nixpkgs: lib and pkgs are stand-ins for the few functions the module
# calls, an option is the attribute set given to mkOption, and the service's configuration is the options'
# defaults (a submodule's from its own options) updated with `values`. TOML rendering is replaced by JSON
# behind a "toml:" prefix, so the generated config can be read back out of ExecStart.
{ module, values }:

let
  types = {
    package = "package";
    str = "str";
    port = "port";
    bool = "bool";
    int = "int";
    float = "float";
    number = "number";
    ints = { positive = "positive"; unsigned = "unsigned"; };
    nullOr = t: { nullOr = t; };
    attrsOf = t: { attrsOf = t; };
    listOf = t: { listOf = t; };
    either = a: b: { either = [ a b ]; };
    enum = choices: { enum = choices; };
    submodule = m: { submodule = m; };
  };
  lib = {
    inherit types;
    mkOption = args: args // { _option = true; };
    mkEnableOption = what: { _option = true; type = "bool"; default = false; description = what; };
    mkIf = condition: content: { _if = condition; inherit content; };
    literalExpression = text: { _literal = text; };
    getBin = p: p;
    getExe = p: "${p}/bin/llama-router";
  };
  pkgs = {
    stdenv.hostPlatform.system = "x86_64-linux";
    llama-cpp = "/nix/store/stub-llama-cpp";
    coreutils = "/nix/store/stub-coreutils";
    formats.toml = _: { type = "toml"; generate = name: value: "toml:" + builtins.toJSON value; };
  };
  self = { packages.x86_64-linux.default = "/nix/store/stub-llama-router"; };

  merge = left: right:
    left // builtins.mapAttrs
      (k: v: if builtins.isAttrs v && left ? ${k} && builtins.isAttrs left.${k} then merge left.${k} v else v)
      right;
  defaultsOf = options: builtins.mapAttrs
    (name: o:
      if builtins.isAttrs o.type && o.type ? submodule
      then merge (defaultsOf o.type.submodule.options) (o.default or { })
      else o.default or null)
    options;

  evaluated = (import module self) { inherit lib pkgs config; };
  options = evaluated.options.services.llama-router;
  config.services.llama-router = merge (defaultsOf options) values;
  service = evaluated.config.content.systemd.services.llama-router;
in
{
  options = builtins.attrNames options;
  promptCache = builtins.attrNames options.promptCache.type.submodule.options;
  modelOptions = builtins.attrNames options.models.type.attrsOf.submodule.options;
  enabled = evaluated.config._if;
  execStart = service.serviceConfig.ExecStart;
  environment = service.environment;
  stateDirectory = service.serviceConfig.StateDirectory;
  dynamicUser = service.serviceConfig.DynamicUser;
  protectSystem = service.serviceConfig.ProtectSystem;
  firewall = evaluated.config.content.networking.firewall.allowedTCPPorts;
}
