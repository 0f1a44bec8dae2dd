#pragma once
/// @file lab.h
/// @brief Course labs: what a student tree's unfinished exercises throw.
///
/// A few regions of the reference code are exercises (docs/labs.md). In the source they read
///
///     // EXERCISE 02.1 BEGIN: keep the new keys and values, attend over the whole cache
///     ... the reference lines ...
///     // EXERCISE 02.1 STUB
///     // lab::not_done("02.1", "copy k and v into rows start .. end of the layer's cache, ...");
///     // EXERCISE 02.1 END
///
/// `make lab` writes a student tree in which each region is replaced by its stub (the lines
/// after STUB, uncommented). The stub compiles, and running it throws ExerciseNotDone with a
/// message that says which exercise, what to do and where to read about it.
///
/// ExerciseNotDone is deliberately not an inferlab::Error: a test that expects a bad input to
/// be refused must not pass because the code it tests is missing.

#include <stdexcept>
#include <string>
#include <vector>

namespace inferlab::lab {

/// Thrown by the stub of an exercise that has not been done yet.
class ExerciseNotDone : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Throws "exercise <id> is not done yet: <what> (chapter NN's README, section Lab)".
[[noreturn]] void not_done(const char* id, const char* what);

/// Records that the code of exercise `id` ran. Called only in trace trees (`tools/lab.sh
/// relabel`), which find out which tests depend on which exercise: where the environment names
/// a trace file (INFERLAB_LAB_TRACE) and the running test (INFERLAB_LAB_TEST, set by the test
/// runner and inherited by the programs a test starts), appends "<test> <id>" to the file.
void reached(const char* id);

}  // namespace inferlab::lab
