/* The first process of every pod sandbox on the fleet's node (containerd's sandbox_image): it holds
 * the pod's namespaces open, reaps any orphan handed to it, and exits when the runtime stops it.
 * Built static, so the image needs nothing else (pause-image.sh). */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigaction(SIGINT, &stop, NULL);
  sigaction(SIGTERM, &stop, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) {
    pause();
  }
}
