/* Binds a TensorFlow gRPC server to one worker's loopback address (LD_PRELOAD, the TPU runtime stand-in only).
 *
 * TensorFlow 2.9's server listens on "0.0.0.0:<port>" whatever address its task has, so the runtimes of
 * several emulated workers cannot all hold port 8470 on one machine, where each real worker has its own
 * host. With TPU_RUNTIME_BIND_ADDRESS set, a bind to the wildcard address (IPv4, or IPv6 dual stack as
 * gRPC uses) becomes a bind to that address (v4-mapped for IPv6); every other bind is left alone.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *want = getenv("TPU_RUNTIME_BIND_ADDRESS");
    struct in_addr v4;
    if (!want || !addr || inet_pton(AF_INET, want, &v4) != 1) return real_bind(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in copy;
        memcpy(&copy, addr, sizeof copy);
        if (copy.sin_addr.s_addr == htonl(INADDR_ANY)) copy.sin_addr = v4;
        return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 copy;
        memcpy(&copy, addr, sizeof copy);
        if (IN6_IS_ADDR_UNSPECIFIED(&copy.sin6_addr)) {
            memset(&copy.sin6_addr, 0, sizeof copy.sin6_addr);
            copy.sin6_addr.s6_addr[10] = 0xff;
            copy.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&copy.sin6_addr.s6_addr[12], &v4, 4);
        }
        return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
    }
    return real_bind(fd, addr, len);
}
