/* Test helper for tests/test_serve.sh: opens N TCP connections to 127.0.0.1:PORT, sends a partial
 * request line ("GET /hea") on each and keeps them open for SECONDS (a client that locks others
 * out, issue #21). Prints how many connected. Usage: halfopen PORT N SECONDS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: halfopen PORT N SECONDS\n");
    return 2;
  }
  const int port = atoi(argv[1]), n = atoi(argv[2]), secs = atoi(argv[3]);
  struct rlimit r;
  if (!getrlimit(RLIMIT_NOFILE, &r) && r.rlim_cur < (rlim_t)n + 16) {
    r.rlim_cur = r.rlim_max < (rlim_t)n + 16 ? r.rlim_max : (rlim_t)n + 16;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ok = 0;
  for (int i = 0; i < n; i++) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) || send(fd, "GET /hea", 8, MSG_NOSIGNAL) != 8) {
      close(fd);
      continue;
    }
    ok++;
  }
  printf("%d\n", ok);
  fflush(stdout);
  sleep((unsigned)secs);
  return 0;
}
