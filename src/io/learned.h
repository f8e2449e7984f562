/* Learned expert profiles (issue #23): the routing counts strata sees while it runs, kept per model
 * file so that the next run on the same file fills its GPU expert caches from them, with no
 * calibration step. The files live in $XDG_CACHE_HOME/strata/ (or ~/.cache/strata/ when that
 * variable is unset or not an absolute path), one per model file, named after it and after its
 * identity: the xxHash64 (libxxhash) of the file's size and of its GGUF header (the metadata and the
 * tensor layout, everything before the tensor data). Their format is the expert profile's
 * (io/profile.h, doc/expert-profile.md), so `--expert-profile` reads them too. A save writes a
 * temporary file in the same folder and renames it over the old one: a reader sees the old file or
 * the new one, never part of one. Saves hold an exclusive lock (flock on the file's name + ".lock")
 * and add what the process routed since its last save to the file as it is then, so runs that
 * overlap in time (a server and generate runs beside it) all count. */
#ifndef ST_LEARNED_H
#define ST_LEARNED_H

#include <stddef.h>
#include <stdint.h>

struct st_model;

struct st_learned {
  char path[4096]; /* the model's file in the cache folder; "" when learning is off */
  uint32_t n_layer, n_expert, top_k;
  uint64_t *base;       /* [n_layer][n_expert]: the counts of earlier runs (the file at start), owned */
  uint64_t base_tokens; /* tokens of earlier runs */
  int loaded;           /* the file was there, and valid for this model, at start */
  uint64_t *saved;      /* [n_layer][n_expert]: this process's counts already added to the file, owned */
  uint64_t saved_tokens; /* its tokens already added */
  uint64_t file_tokens; /* the file's tokens after the last save */
  char note[4608];      /* which profile the run uses, one line for the command to print once the
                           engine is up (so that a refusal stays one line) */
};

/* The model file's identity: 16 lowercase hex digits of xxHash64 over its size (8 bytes, little
 * endian) and its GGUF header, into out[17]. */
void st_learned_identity(const struct st_model *m, char out[17]);

/* Prepares learning for model m: finds the cache folder (creating it, mode 0700, with its
 * parents), names the file and reads it when it is there. A file that does not parse or does not
 * fit the model is ignored with one warning on stderr that names it and says why (the next save
 * rewrites it); a folder that cannot be made turns learning off with a warning (path ""). Returns
 * 0 or ST_ENOMEM. */
int st_learned_open(struct st_learned *l, const struct st_model *m);

/* Adds this run's routing since its last save to the file: counts are the run's routed entries so
 * far ([n_layer][n_expert], cumulative), tokens its tokens so far. Under the lock it reads the file
 * as it is now (none, or one that does not fit, counts as empty), adds counts - saved and tokens -
 * saved_tokens, and replaces it atomically; then saved = counts, file_tokens = the file's tokens.
 * Nothing to do while the path is "". 0, or ST_EIO / ST_ENOMEM with a message naming the file. */
int st_learned_save(struct st_learned *l, const uint64_t *counts, uint64_t tokens);

void st_learned_close(struct st_learned *l);

#endif
