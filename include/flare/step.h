/* Flare's explicit step marker.
 *
 * Flare finds training steps from the DataLoader iterator (a traced Python span). A job that
 * has no DataLoader, or a C++ program, marks the start of each step itself:
 *
 *   for (int step = 0; ; ++step) { flare_step(); forward(); backward(); optimizer_step(); }
 *
 * The call records one marker with the host time (no GPU work, no lock, no allocation in steady
 * state). It lives in libflare_hook.so: a program that must also run without Flare looks it up
 * with dlsym(RTLD_DEFAULT, "flare_step") and skips the call when absent. Returns 0 when the
 * marker was recorded, -1 when tracing is off.
 */
#ifndef FLARE_STEP_H_
#define FLARE_STEP_H_

#ifdef __cplusplus
extern "C" {
#endif

int flare_step(void);

/* The name of the record a marker travels as (a zero-length host span): the one place the
 * encoder and the readers of the records recognize it by. */
#define FLARE_STEP_MARKER_NAME "flare_step"

#ifdef __cplusplus
}
#endif

#endif /* FLARE_STEP_H_ */
