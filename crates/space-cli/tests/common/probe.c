/* A raw system call from inside a sandbox, for the isolation tests: `probe NR [ARG...]`
 * makes syscall NR with up to six integer arguments and prints `ok RET` or `errno N`.
 * `probe seize PID` tries PTRACE_SEIZE of PID until it succeeds, prints `attached` and
 * keeps tracing until killed.
 * Built statically by the test harness (templates carry no libc of ours). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <unistd.h>

static int seize(long pid) {
    while (ptrace(PTRACE_SEIZE, pid, 0, 0) != 0)
        ;
    printf("attached\n");
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    long a[6] = {0};
    if (argc < 2) {
        fprintf(stderr, "usage: probe NR [ARG...] | probe seize PID\n");
        return 2;
    }
    if (strcmp(argv[1], "seize") == 0 && argc == 3)
        return seize(strtol(argv[2], 0, 0));
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
