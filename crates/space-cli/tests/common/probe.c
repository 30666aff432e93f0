/* A raw system call from inside a sandbox, for the isolation tests: `probe NR [ARG...]`
 * makes syscall NR with up to six integer arguments and prints `ok RET` or `errno N`.
 * `probe hold-inotify` creates inotify instances until it may not, prints how many and the
 * errno that stopped it, and keeps them until killed.
 * Built statically by the test harness (templates carry no libc of ours). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

static int hold_inotify(void) {
    int n = 0;
    while (inotify_init1(IN_CLOEXEC) >= 0)
        n++;
    printf("%d %d\n", n, errno);
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    long a[6] = {0};
    if (argc < 2) {
        fprintf(stderr, "usage: probe NR [ARG...] | probe hold-inotify\n");
        return 2;
    }
    if (strcmp(argv[1], "hold-inotify") == 0)
        return hold_inotify();
    for (int i = 2; i < argc && i < 8; i++)
        a[i - 2] = strtol(argv[i], 0, 0);
    long r = syscall(strtol(argv[1], 0, 0), a[0], a[1], a[2], a[3], a[4], a[5]);
    if (r < 0) {
        printf("errno %d\n", errno);
        return 1;
    }
    printf("ok %ld\n", r);
    return 0;
}
