self:
{ config, lib, pkgs, ... }:

let
  cfg = config.services.llama-router;
  toml = pkgs.formats.toml { };
  settings = lib.recursiveUpdate cfg.settings {
    router = {
      host = cfg.host;
      port = cfg.port;
      llama_server = "${lib.getBin cfg.llamaCpp}/bin/llama-server";
      history_db = "/var/lib/llama-router/history.db";
      replica_logs = "/var/lib/llama-router/logs";
    };
    models = cfg.models;
  };
  configFile = toml.generate "llama-router.toml" settings;
in
{
  options.services.llama-router = {
    enable = lib.mkEnableOption "llama-router, an OpenAI-compatible front for llama.cpp's llama-server";

    package = lib.mkOption {
      type = lib.types.package;
      default = self.packages.${pkgs.stdenv.hostPlatform.system}.default;
      description = "The llama-router package.";
    };

    llamaCpp = lib.mkOption {
      type = lib.types.package;
      default = pkgs.llama-cpp;
      example = lib.literalExpression "pkgs.llama-cpp.override { cudaSupport = true; }";
      description = "llama.cpp build whose llama-server the router runs (a CUDA or ROCm build for GPUs).";
    };

    host = lib.mkOption {
      type = lib.types.str;
      default = "127.0.0.1";
      description = "Address to listen on. Loopback by default; put a reverse proxy or API keys in front before widening it.";
    };

    port = lib.mkOption {
      type = lib.types.port;
      default = 8080;
      description = "TCP port to listen on.";
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Open the port in the firewall.";
    };

    settings = lib.mkOption {
      type = toml.type;
      default = { };
      example = { router = { max_models_per_gpu = 1; eviction = "lru"; }; defaults = { flash-attn = "on"; }; };
      description = "The rest of the TOML config ([router], [devices.N], [defaults], [pools.NAME]); see the README's configuration reference.";
    };

    models = lib.mkOption {
      type = lib.types.attrsOf toml.type;
      default = { };
      example = { qwen = { model = "/var/lib/models/qwen.gguf"; gpus = [ 0 1 ]; parallel = 4; }; };
      description = "The [models.NAME] tables.";
    };
  };

  config = lib.mkIf cfg.enable {
    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ cfg.port ];

    systemd.services.llama-router = {
      description = "llama-router";
      wantedBy = [ "multi-user.target" ];
      after = [ "network.target" ];
      serviceConfig = {
        ExecStart = "${lib.getExe cfg.package} --config ${configFile}";
        ExecReload = "${pkgs.coreutils}/bin/kill -HUP $MAINPID";
        DynamicUser = true;
        StateDirectory = "llama-router";
        SupplementaryGroups = [ "video" "render" ];
        Restart = "on-failure";
        KillMode = "mixed";
        TimeoutStopSec = 60;
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        PrivateTmp = true;
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectControlGroups = true;
        RestrictNamespaces = true;
        LockPersonality = true;
        RestrictRealtime = true;
        SystemCallArchitectures = "native";
        RestrictAddressFamilies = [ "AF_INET" "AF_INET6" "AF_UNIX" "AF_NETLINK" ];
      };
    };
  };
}
