#include "run/signals.hpp"

#include <csignal>

namespace gpt {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;  // the one process-wide flag a signal handler may set
void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_signals() {
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}
bool stop_requested() { return g_stop_signal != 0; }

}  // namespace gpt
