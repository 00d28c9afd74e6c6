# The router's configuration document (rendered to TOML by module.nix) from the values of the
# services.llama-router options. Written with builtins only, so that it evaluates, and is tested, without
# nixpkgs.
#
# Besides the router's own names it takes the option names of the original llama-router module:
#   maxModelsPerGpu        -> [router] max_models_per_gpu
#   evictionPolicy         -> [router] eviction ("lru" or "fifo")
#   queueHeadGrace         -> [router] queue_head_grace
#   queueForceLoadTimeout  -> [router] queue_force_load_timeout
#   gpuCount               -> [router] num_gpus
#   promptCache.ramMiB     -> cram = N in every model's table (llama-server --cache-ram, MiB per replica)
#   promptCache.ramMiBPerModel.NAME -> cram = N in that model's table instead
#   promptCache.reuseChunk -> [defaults] cache-reuse (llama-server --cache-reuse)
#   presetGlobals          -> [defaults]; the keys the router owns (c, ngl, np and their long forms) go to
#                             every model's table instead, where a model's own key wins
#   models.NAME            -> [models.NAME]; c / ctx-size -> ctx, ngl / gpu-layers / n-gpu-layers ->
#                             gpu_layers, np -> parallel, cost -> pricing
# Precedence for cram, first found: the model's own cram (or cache-ram), promptCache.ramMiBPerModel.NAME,
# then promptCache.ramMiB unless [defaults] (presetGlobals or settings.defaults) sets it for every model.
# Options left null are not written: the router's defaults (or `settings`) apply. The paths the router
# writes (history_db, replica_logs, kv_store_dir) are under stateDir, the service's StateDirectory: the
# only folder the service may write.
{ cfg, llamaServer, stateDir ? "/var/lib/llama-router" }:

let
  inherit (builtins) attrNames elem filter hasAttr isAttrs listToAttrs mapAttrs removeAttrs;

  # llama.cpp's names for what the router's own keys set.
  renames = {
    c = "ctx";
    ctx-size = "ctx";
    ngl = "gpu_layers";
    gpu-layers = "gpu_layers";
    n-gpu-layers = "gpu_layers";
    np = "parallel";
    cost = "pricing";
  };
  # Router keys that presetGlobals hands to every model rather than to [defaults].
  perModelKeys = [ "ctx" "gpu_layers" "parallel" ];

  dropNulls = table: removeAttrs table (filter (k: table.${k} == null) (attrNames table));

  # A table with llama.cpp's names turned into the router's; a key already written the router's way wins.
  rename = table:
    let
      renamed = filter (k: hasAttr k table) (attrNames renames);
      moved = listToAttrs (map (k: { name = renames.${k}; value = table.${k}; }) renamed);
    in
    moved // removeAttrs table renamed;

  # Like nixpkgs' lib.recursiveUpdate: tables merge, anything else on the right wins.
  merge = left: right:
    left // mapAttrs
      (k: v: if isAttrs v && hasAttr k left && isAttrs left.${k} then merge left.${k} v else v)
      right;

  opt = name: cfg.${name} or null;
  cache = dropNulls (cfg.promptCache or { });
  perModelCram = cache.ramMiBPerModel or { };
  settings = cfg.settings or { };

  globals = rename (dropNulls (cfg.presetGlobals or { }));
  globalModelKeys = removeAttrs globals (filter (k: !(elem k perModelKeys)) (attrNames globals));
  defaults = merge (settings.defaults or { }) (
    removeAttrs globals perModelKeys
    // (if (cache.reuseChunk or null) == null then { } else { cache-reuse = cache.reuseChunk; })
  );
  setsCram = table: hasAttr "cram" table || hasAttr "cache-ram" table;
  globalCram = if setsCram defaults then null else cache.ramMiB or null;

  modelTable = name: raw:
    let
      own = globalModelKeys // rename (dropNulls raw);
      cram = perModelCram.${name} or globalCram;
    in
    own // (if setsCram own || cram == null then { } else { inherit cram; });

  router = dropNulls {
    host = opt "host";
    port = opt "port";
    llama_server = llamaServer;
    history_db = "${stateDir}/history.db";
    replica_logs = "${stateDir}/logs";
    kv_store_dir = "${stateDir}/kv";
    max_models_per_gpu = opt "maxModelsPerGpu";
    eviction = opt "evictionPolicy";
    queue_head_grace = opt "queueHeadGrace";
    queue_force_load_timeout = opt "queueForceLoadTimeout";
    num_gpus = opt "gpuCount";
  };

  tables = merge (settings.models or { }) (cfg.models or { });
  strays = filter (name: !(hasAttr name tables)) (attrNames perModelCram);
  models =
    if strays == [ ] then mapAttrs modelTable tables
    else throw "services.llama-router.promptCache.ramMiBPerModel names no model: ${builtins.concatStringsSep ", " strays}";
in
removeAttrs settings [ "router" "defaults" "models" ]
// { router = (settings.router or { }) // router; models = models; }
// (if defaults == { } then { } else { inherit defaults; })
