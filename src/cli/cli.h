/* Subcommands of the `strata` binary. Each takes argv with argv[0] = the subcommand name,
 * prints its own errors as one line `strata <cmd>: <message>` and returns the exit status. */
#ifndef ST_CLI_H
#define ST_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

int st_cmd_generate(int argc, char **argv);
int st_cmd_eval(int argc, char **argv);
int st_cmd_tokenize(int argc, char **argv);
int st_cmd_mkmodel(int argc, char **argv);
int st_cmd_profile(int argc, char **argv);

/* Parses "1,2,3" or "[1, 2, 3]" into a malloc'd array (caller frees). 0 or ST_EINVAL. */
int st_parse_ids(const char *s, int32_t **ids, size_t *n);

/* Parses a whole decimal number in [lo, hi]; 0 or ST_EINVAL naming `flag`. */
int st_parse_int(const char *flag, const char *s, long lo, long hi, long *out);
int st_parse_float(const char *flag, const char *s, double lo, double hi, double *out);

/* Prints ids as a JSON array and a newline. */
void st_print_ids(FILE *f, const int32_t *ids, size_t n);

#endif
