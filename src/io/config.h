/* The model config file `strata serve --config strata-<quant>.json` reads: which model, which
 * GPUs (numbered as nvidia-smi numbers them), the engine flags, and where to listen. The keys
 * and the multi-GPU rules come from the seeds (SECOND_GPU.md, "Peer tier": several GPUs in
 * "gpu" mean a layer split unless --peer-device is among the args, and --peer-device N counts
 * positions in the "gpu" list). */
#ifndef ST_CONFIG_H
#define ST_CONFIG_H

#define ST_CONFIG_MAX_GPUS 16

struct st_config {
  char *model;            /* "model": GGUF path (required) */
  int gpu[ST_CONFIG_MAX_GPUS]; /* "gpu": device numbers as nvidia-smi numbers them */
  int n_gpu;              /* 0 when "gpu" is absent (the devices the process sees are used) or [] */
  int gpu_listed;         /* "gpu" is present; [] then means no GPU: the CPU pool only */
  char **args;            /* "args": engine flags, as on the command line; n_args entries */
  int n_args;
  char *host;             /* "host" (default "127.0.0.1") */
  int port;               /* "port" (default 8080) */
  char *name;             /* "name": model id for /v1/models (default: the config file's basename
                             without .json) */
  int max_tokens;         /* "max_tokens": per-request default and cap, tokens; 0 = not set */
  int remote_expert_opt;  /* "remote_expert_opt": adds --remote-expert-opt when a helper cache is among the args */
  int has_remote_expert_opt; /* the key was present */
};

/* Reads `path` into *c (zeroed first; free with st_config_free even on error). Errors:
 * ST_EIO (unreadable), ST_EFORMAT naming the key for: invalid JSON, a non-object top level, an
 * unknown key, a value of the wrong type (naming the expected type), a missing "model", a port
 * outside 1..65535, a negative GPU number, more than ST_CONFIG_MAX_GPUS GPUs. Messages start
 * with the file name. */
int st_config_load(const char *path, struct st_config *c);
void st_config_free(struct st_config *c);

/* Applies the seeds' GPU rules before the engine starts StarPU. Any "gpu" list sets
 * CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's order) and CUDA_VISIBLE_DEVICES to the list, so its
 * first card is CUDA0 (overwriting any values), and logs that on stderr. Several GPUs mean the
 * peer tier when --peer-device N is among the args (N counts positions in the list: 1..n-1, else
 * ST_EINVAL), helper caches when --expert-cache-device1..3 are, and otherwise a layer split: then
 * "--layer-split auto" is appended to the args. "remote_expert_opt": true appends
 * --remote-expert-opt when a helper cache is among the args (logged as ignored otherwise).
 * Returns 0, ST_EINVAL or ST_ENOMEM; c's args may grow. */
int st_config_apply_gpus(struct st_config *c);

#endif
