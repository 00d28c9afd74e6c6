self:
{ config, lib, pkgs, ... }:

let
  cfg = config.services.llama-router;
  toml = pkgs.formats.toml { };
  # Everything the router writes lives under the service's StateDirectory (systemd creates it, owned by the
  # dynamic user; the rest of the file system is read-only to the service): the request history, the
  # replica logs, the saved KV states (settings.nix) and the cache of each llama-server's flags and build
  # (XDG_CACHE_HOME below).
  stateDirectory = "llama-router";
  stateDir = "/var/lib/${stateDirectory}";
  # The options below, the original llama-router module's names included, as the TOML config's tables.
  settings = import ./settings.nix {
    inherit cfg stateDir;
    llamaServer = "${lib.getBin cfg.llamaCpp}/bin/llama-server";
  };
  configFile = toml.generate "llama-router.toml" settings;
  nullable = type: default: description: lib.mkOption { type = lib.types.nullOr type; inherit default description; };
  modelOptions = {
    freeformType = toml.type;
    options = {
      c = nullable lib.types.ints.positive null
        "Total context of a replica (llama.cpp's -c), written as the router's `ctx`. Unset: the largest that fits.";
      cost = nullable (lib.types.attrsOf lib.types.number) null
        "Prices in dollars per million tokens (`input`, `cached_input`, `output`), written as `pricing` and shown in /v1/models.";
      reasoning_effort = nullable toml.type null
        "Reasoning effort levels: `options` (a list) and optionally `default`, shown in /v1/models.";
    };
  };
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
      type = lib.types.attrsOf (lib.types.submodule modelOptions);
      default = { };
      example = { qwen = { model = "/var/lib/models/qwen.gguf"; gpus = [ 0 1 ]; parallel = 4; c = 65536; }; };
      description = ''
        The [models.NAME] tables: the router's keys and llama-server flags. llama.cpp's names for what the
        router sets are accepted and renamed: c / ctx-size to ctx, ngl / gpu-layers / n-gpu-layers to
        gpu_layers, np to parallel, and cost to pricing.
      '';
    };

    # Scheduler options under the original llama-router module's names; null leaves the router's default
    # (or the value in `settings.router`).
    maxModelsPerGpu = nullable lib.types.ints.positive null
      "Models resident on one GPU at once (`max_models_per_gpu`; the router's default is 1).";

    evictionPolicy = nullable (lib.types.enum [ "lru" "fifo" ]) null
      "Which resident leaves a GPU for another model (`eviction`): lru, the oldest last request (the default), or fifo, the earliest loaded.";

    queueHeadGrace = nullable (lib.types.either lib.types.int lib.types.float) null
      "Seconds a request that needs a swap lets later requests for resident models go first (`queue_head_grace`; default 0).";

    queueForceLoadTimeout = nullable (lib.types.either lib.types.int lib.types.float) null
      "Seconds after which a waiting request takes its GPUs and gets its swap (`queue_force_load_timeout`; default 300).";

    gpuCount = nullable lib.types.ints.unsigned null
      "Number of GPUs, overriding detection (`num_gpus`).";

    promptCache = lib.mkOption {
      default = { };
      description = "llama-server's host-memory prompt cache, per replica.";
      type = lib.types.submodule {
        options = {
          ramMiB = nullable lib.types.ints.unsigned null
            "MiB of host memory each replica keeps for conversations not in a slot: `cram` in every model's table (llama-server --cache-ram).";
          ramMiBPerModel = lib.mkOption {
            type = lib.types.attrsOf lib.types.ints.unsigned;
            default = { };
            example = { big-model = 32768; };
            description = "A model's own `cram`, replacing ramMiB for it.";
          };
          reuseChunk = nullable lib.types.ints.unsigned null
            "Smallest chunk llama-server reuses by shifting the KV cache (`cache-reuse` in [defaults]); sliding-window and hybrid models ignore it.";
        };
      };
    };

    presetGlobals = lib.mkOption {
      type = lib.types.attrsOf toml.type;
      default = { };
      example = { jinja = true; ctk = "q8_0"; ctv = "q8_0"; };
      description = ''
        llama-server flags for every model: the [defaults] table, over `settings.defaults`. c, ngl, np and
        their long forms are the router's own keys, so they go to every model's table instead (a model's own
        key wins). A model's own flag wins over these; these win over promptCache.ramMiB.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ cfg.port ];

    systemd.services.llama-router = {
      description = "llama-router";
      wantedBy = [ "multi-user.target" ];
      after = [ "network.target" ];
      environment = {
        XDG_STATE_HOME = stateDir;
        XDG_CACHE_HOME = "${stateDir}/cache";
      };
      serviceConfig = {
        ExecStart = "${lib.getExe cfg.package} --config ${configFile}";
        ExecReload = "${pkgs.coreutils}/bin/kill -HUP $MAINPID";
        DynamicUser = true;
        StateDirectory = stateDirectory;
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
