// Contract 9, second half: a write that fails (a full disk) is one error
// naming the file, exit 1; the previous checkpoint stays valid and `latest`
// keeps naming it; a resume or restart first removes what a failed write
// left. The disk is a small tmpfs, filled so that the failure lands in each
// file of a checkpoint in turn (root only; SKIPPED otherwise).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "helpers.hpp"

using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;
namespace fs = std::filesystem;

namespace {

// hidden 64: every checkpoint file but the small ones spans several pages.
const std::string kTiny = " --model.name mlp --model.hidden 64 --optim.schedule constant --log.tensorboard=false "
                          "--log.every-steps 1 --eval.every-steps 1000000 --eval.max-samples 8 --quiet ";

// A tmpfs of `bytes` at a fresh directory, unmounted on destruction;
// mounted() is false when it cannot be (not root, no tmpfs).
class SmallDisk {
 public:
  explicit SmallDisk(const TempDir& tmp, long bytes) : path_(tmp / "disk") {
    fs::create_directories(path_);
    if (geteuid() != 0) return;
    mounted_ = mount("tmpfs", path_.c_str(), "tmpfs", 0, ("size=" + std::to_string(bytes)).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& path() const { return path_; }
  long page() const {
    struct statvfs s {};
    statvfs(path_.c_str(), &s);
    return static_cast<long>(s.f_bsize);
  }
  long free_bytes() const {
    struct statvfs s {};
    statvfs(path_.c_str(), &s);
    return static_cast<long>(s.f_bavail * s.f_bsize);
  }
  // Takes all but `left` bytes of the free space with one file.
  bool fill_leaving(long left, const std::string& name = "filler") const {
    long size = free_bytes() - left;
    if (size < 0) return false;
    int fd = ::open((path_ + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0 && (size == 0 || posix_fallocate(fd, 0, size) == 0);
    if (fd >= 0) ::close(fd);
    return ok && free_bytes() == left;
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

long pages(const std::string& file, long page) {
  return static_cast<long>((fs::file_size(file) + page - 1) / page);
}

int error_lines(const std::string& err) {
  int n = 0;
  for (const auto& line : cohort::test::lines_of(err)) n += line.rfind("cohort: error: ", 0) == 0;
  return n;
}

}  // namespace

// The restarts failed on metrics.jsonl.tmp because the failed
// write's .tmp-step-N still filled the disk: a resume removes it first.
TEST(DiskFull, ResumeRemovesPartialCheckpointsAndTemporariesFirst) {
  TempDir tmp;
  cohort::RunDir dir(tmp / "run");
  fs::create_directories(tmp / "run/checkpoints/.tmp-step-40");
  cohort::test::write_file(tmp / "run/checkpoints/.tmp-step-40/optimizer.pt", std::string(1000, 'x'));
  cohort::test::write_file(tmp / "run/checkpoints/latest.tmp", "step-4");
  cohort::test::write_file(tmp / "run/metrics.jsonl.tmp", "{\"step\":1}\n");
  cohort::test::write_file(tmp / "run/metrics.jsonl", "{\"step\":1}\n");
  auto notes = dir.prepare(cohort::RunMode::kResume, "a = 1\n", 20);
  EXPECT_FALSE(fs::exists(tmp / "run/checkpoints/.tmp-step-40"));
  EXPECT_FALSE(fs::exists(tmp / "run/checkpoints/latest.tmp"));
  EXPECT_FALSE(fs::exists(tmp / "run/metrics.jsonl.tmp"));
  EXPECT_NE(std::find(notes.begin(), notes.end(), "removed partial checkpoint .tmp-step-40"), notes.end());
}

// A checkpoint whose write fails in any of its files, or in the run
// directory's own rewrites on resume: one line naming the file, exit 1, no
// abort; step-1 stays valid and `latest` names it; no partial checkpoint
// is left; with the space back, the same resume succeeds.
TEST(DiskFull, AFailedWriteInEachCheckpointFileIsOneErrorAndKeepsThePrevious) {
  TempDir tmp;
  SmallDisk disk(tmp, 4 << 20);
  if (!disk.mounted()) GTEST_SKIP() << "needs root to mount a tmpfs";
  cohort::test::write_tiny_dataset(tmp, 16);
  // The run to continue: one checkpoint (step-1), made on the tmpfs.
  const std::string base = disk.path() + "/base";
  auto first = run_cohort("train" + kTiny + "--train.max-steps 1 --data.path " + tmp.path() + " --out " + base);
  ASSERT_EQ(first.code, 0) << first.err;
  const long page = disk.page();
  const std::string ckpt = base + "/checkpoints/step-1/";
  // Pages that the resume takes before it writes step-2: RUN_DIR/.lock.
  // (metrics.jsonl and config.toml are rewritten through a one-page
  // temporary, then take the pages they had.)
  ASSERT_LT(fs::file_size(base + "/metrics.jsonl"), 2048u) << "two more lines must not need a new page";
  // The order Checkpoints::write writes in, and each file's pages.
  const std::vector<std::pair<std::string, long>> files = {
      {"model.safetensors", pages(ckpt + "model.safetensors", page)},
      {"optimizer.pt", pages(ckpt + "optimizer.pt", page)},
      {"rng.safetensors", pages(ckpt + "rng.safetensors", page)},
      {"config.toml", pages(ckpt + "config.toml", page)},
      {"state.json", pages(ckpt + "state.json", page)},
      {"latest", 1}};
  ASSERT_GE(files[0].second, 2) << "model.safetensors must span pages";
  ASSERT_GE(files[1].second, 2) << "optimizer.pt must span pages";

  std::vector<std::pair<std::string, long>> cases = {{"metrics.jsonl.tmp", 1}};  // after the lock: no page left
  long before = 1;  // the lock
  for (const auto& [name, n] : files) {
    // All the files before it fit, and all but one page of it.
    cases.emplace_back(name == "latest" ? "checkpoints/latest.tmp" : ".tmp-step-2/" + name, before + n - 1);
    before += n;
  }
  for (const auto& [failing, left_pages] : cases) {
    SCOPED_TRACE(failing);
    const std::string run = disk.path() + "/run";
    fs::remove_all(run);
    fs::remove(disk.path() + "/filler");
    fs::copy(base, run, fs::copy_options::recursive);
    ASSERT_TRUE(disk.fill_leaving(left_pages * page));
    auto r = run_cohort("train --resume " + run + " --train.max-steps 2 --quiet");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(error_lines(r.err), 1) << r.err;
    EXPECT_EQ(cohort::test::lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("/" + failing + ": write failed (No space left on device)"), std::string::npos) << r.err;
    EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-1\n");
    EXPECT_NO_THROW(cohort::Checkpoints::verify(run + "/checkpoints/step-1"));
    EXPECT_FALSE(fs::exists(run + "/checkpoints/.tmp-step-2")) << "the partial checkpoint is removed";
    if (failing.find("latest") != std::string::npos) {
      // step-2 was complete before `latest` was to name it.
      EXPECT_NO_THROW(cohort::Checkpoints::verify(run + "/checkpoints/step-2"));
    } else {
      EXPECT_FALSE(fs::exists(run + "/checkpoints/step-2"));
    }
    fs::remove(disk.path() + "/filler");
    auto again = run_cohort("train --resume " + run + " --train.max-steps 2 --quiet");
    EXPECT_EQ(again.code, 0) << again.err;
    EXPECT_EQ(cohort::Checkpoints::resolve(run, nullptr).state.step, 2);
  }
}

// The restarts: a write that died (a crash, or a build without
// the clean-up) left a partial checkpoint as big as all the space there
// was, and the job's lock. The restart, the same job (COHORT_JOB_ID, as the
// launcher passes it), takes its lock in place, removes the partial
// checkpoint first, and goes on.
TEST(DiskFull, ARestartRemovesThePartialCheckpointThatFilledTheDisk) {
  TempDir tmp;
  SmallDisk disk(tmp, 4 << 20);
  if (!disk.mounted()) GTEST_SKIP() << "needs root to mount a tmpfs";
  cohort::test::write_tiny_dataset(tmp, 16);
  const std::string run = disk.path() + "/run";
  auto first = run_cohort("train" + kTiny + "--train.max-steps 1 --data.path " + tmp.path() + " --out " + run);
  ASSERT_EQ(first.code, 0) << first.err;
  cohort::test::write_file(run + "/.lock", "{\"job\":\"job-9\",\"host\":\"elsewhere\",\"pid\":1,\"nonce\":\"n\"}\n");
  fs::create_directories(run + "/checkpoints/.tmp-step-2");
  ASSERT_TRUE(disk.fill_leaving(0, "run/checkpoints/.tmp-step-2/optimizer.pt"));
  auto r = run_cohort("train --resume " + run + " --train.max-steps 2 --max-restarts 1 --quiet", "COHORT_JOB_ID=job-9");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/.tmp-step-2"));
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-2\n");
  EXPECT_FALSE(fs::exists(run + "/.lock")) << "released at the end";
}

// Issue 46: a full disk in a sharded run (2 ranks, dist.shard optimizer)
// printed 3 lines, the last "rank 0 ... exited with code 1; stopped the
// other 1 rank(s)": the cause was in another line. Now every rank's line
// carries the failed rank's error, and the launcher's last line does too:
// the file that could not be written and the checkpoint that is intact.
TEST(DiskFull, AShardedRunsLastLineNamesTheCauseAndTheIntactCheckpoint) {
  TempDir tmp;
  SmallDisk disk(tmp, 8 << 20);
  if (!disk.mounted()) GTEST_SKIP() << "needs root to mount a tmpfs";
  cohort::test::write_tiny_dataset(tmp, 16);
  const std::string run = disk.path() + "/run";
  const std::string sharded = " --optim.name adamw --dist.shard optimizer --nproc-per-node 2 --oversubscribe ";
  auto first = run_cohort("train" + kTiny + sharded + "--train.max-steps 1 --data.path " + tmp.path() + " --out " + run);
  ASSERT_EQ(first.code, 0) << first.err;
  const long range = static_cast<long>(fs::file_size(run + "/checkpoints/step-1/optimizer.shard-0.safetensors"));
  // Room for the small files and one range, not for both.
  ASSERT_TRUE(disk.fill_leaving((range / disk.page() + 16) * disk.page()));
  auto r = run_cohort("train --resume " + run + sharded + "--train.max-steps 2 --quiet");
  EXPECT_EQ(r.code, 1) << r.err;
  auto lines = cohort::test::lines_of(r.err);
  ASSERT_FALSE(lines.empty());
  const std::string& last = lines.back();
  EXPECT_EQ(last.rfind("cohort: error: rank ", 0), 0u) << r.err;
  EXPECT_NE(last.find("stopped the other 1 rank(s)"), std::string::npos) << r.err;
  EXPECT_NE(last.find(".safetensors: write failed (No space left on device)"), std::string::npos) << r.err;
  EXPECT_NE(last.find("checkpoint step-2 was not written; step-1 is intact and still the latest"), std::string::npos)
      << r.err;
  for (const auto& line : lines) {  // no line without the cause
    if (line.rfind("cohort: error: ", 0) == 0) {
      EXPECT_NE(line.find("No space left on device"), std::string::npos) << r.err;
    }
  }
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-1\n");
  EXPECT_NO_THROW(cohort::Checkpoints::verify(run + "/checkpoints/step-1"));
}
