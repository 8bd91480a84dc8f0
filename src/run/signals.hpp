// SIGUSR1 / SIGTERM / SIGINT: finish the step, checkpoint, exit 75 (the run loop asks stop_requested()).
#pragma once

namespace gpt {
void install_stop_signals();
bool stop_requested();
}  // namespace gpt
