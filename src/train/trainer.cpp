#include "gclab/train/trainer.h"
#include "gclab/model/registry.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <random>

#include "gclab/config/byte_size.h"
#include "gclab/config/loader.h"
#include "gclab/data/dataset.h"
#include "gclab/log/log.h"
#include "gclab/memory/history.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/run_log.h"
#include "gclab/train/session.h"
#include "gclab/train/state_file.h"

namespace gclab::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The data the run trains on: every dataset's items, scanned once.
std::vector<data::ImageItem> scan(std::vector<config::DatasetConfig>& datasets, bool cache_text_embeddings) {
  if (datasets.empty()) throw data::DataError("no datasets: add a `datasets` entry with a folder_path");
  std::vector<data::ImageItem> items;
  int skipped = 0;
  for (size_t d = 0; d < datasets.size(); ++d) {
    auto result = data::scan_dataset(datasets[d], static_cast<int>(d));
    for (const auto& w : result.warnings) log::warn(w);
    skipped += result.skipped_images;
    log::info("datasets[" + std::to_string(d) + "]: " + std::to_string(result.items.size()) +
              (data::video_dataset(datasets[d]) ? " clips from " : " images from ") + *datasets[d].folder_path);
    items.insert(items.end(), result.items.begin(), result.items.end());
    if (cache_text_embeddings || datasets[d].cache_text_embeddings)
      for (const auto& w : data::disable_caption_randomness(datasets[d]))
        log::warn("datasets[" + std::to_string(d) + "]: " + w);
  }
  if (skipped > 0) log::warn(std::to_string(skipped) + " file(s) skipped in all (see the warnings above)");
  return items;
}

// Every caption the run will ask for (cache_text_embeddings): each item's as the loader makes it without
// dropout, and where its dataset drops captions, its dropout caption, text only (AI Toolkit caches both
// beside the image: get_text_embedding_path, get_blank_text_embedding_path).
std::vector<data::Caption> run_captions(const std::vector<data::ImageItem>& items,
                                        const std::vector<config::DatasetConfig>& datasets,
                                        const std::optional<std::string>& trigger_word) {
  std::vector<data::Caption> out;
  for (const auto& item : items) {
    std::mt19937_64 unused(0);
    auto ds = datasets[static_cast<size_t>(item.dataset)];
    const bool drops = ds.caption_dropout_rate > 0;
    ds.caption_dropout_rate = 0;
    out.push_back({data::process_caption(item.caption, ds, trigger_word, unused), item.controls, {}, item.image});
    if (!drops) continue;
    out.push_back({data::cached_dropout_caption(ds, trigger_word), {}, {}, item.image});
  }
  return out;
}

// The run's memory model (train/predict.h), built on the meta device without logging.
std::unique_ptr<MemoryModel> predict_quietly(const config::ProcessConfig& config) {
  log::QuietScope quiet;
  return std::make_unique<MemoryModel>(config);
}

// checkpoint_policy auto: the run applies the plan its memory model chose (what memory.json then predicts for).
SessionOptions with_auto_choice(const MemoryModel& model, dist::ProcessGroup* group) {
  SessionOptions options;
  options.group = group;
  if (model.estimate().auto_plan) {
    options.auto_choice = model.estimate().auto_plan->chosen;
    log::info(describe_auto_plan(*model.estimate().auto_plan));
  }
  return options;
}

}  // namespace

std::string dry_run(const config::ProcessConfig& config) {
  Session session(config, SessionOptions{/*meta=*/true});
  const ResidentBytes r = session.resident();
  return session.spec().preset + " on the meta device: " + std::to_string(r.weights) + " weight bytes, " +
         std::to_string(r.trained) + " trained, " + std::to_string(session.lora_modules()) +
         " LoRA modules; checkpoint policy " + session.applied_policy().to_string() + "; optimizer " +
         std::string(config::name_of(config.train.optimizer)) + "; nothing was trained";
}

namespace {

// One `gclab train` run as it goes: the session, its saves and log, the loader, the step counters, and
// what an out-of-memory error does.
class Run {
 public:
  Run(const config::ProcessConfig& config, const TrainOptions& options, TrainSummary& summary,
      std::filesystem::path rank_dir, dist::ProcessGroup* group)
      : config_(config),
        options_(options),
        summary_(summary),
        rank_dir_(std::move(rank_dir)),
        group_(group),
        writes_(!group || group->world().writes_outputs()),
        datasets_(config.datasets),
        items_(scan(datasets_, config.train.cache_text_embeddings)),
        predicted_(predict_quietly(config)),
        session_(open_session(config, rank_dir_, with_auto_choice(*predicted_, group))),
        saves_(summary.output_dir, config.name, config.save.max_step_saves_to_keep,
               !config.network && config.save.save_format == config::SaveFormat::diffusers) {}

  // Before the first step: resume, the loader, the latent and text caches, the budget probe, and AI
  // Toolkit's baseline preview.
  void prepare();
  // The steps, until train.steps or a stop request.
  void loop();
  // The last preview, the saves, memory.json.
  void finish();

 private:
  // Out of memory (real or under the cap): skip the batch (oom_policy: skip) and return, or save, report
  // and throw OutOfMemoryStop.
  void on_oom(const c10::OutOfMemoryError& e);
  void stop_out_of_memory(const c10::OutOfMemoryError& e, const memory::MemoryStats& live, const ResidentBytes& held);
  template <class F>
  void oom_guarded(F&& f) {
    try {
      f();
    } catch (const c10::OutOfMemoryError& e) {
      on_oom(e);
    }
  }
  void take_samples(int64_t at);
  // One optimizer step with the previews and saves it triggers, logged.
  void train_one();
  void note_nonfinite(int64_t done, const StepResult& r);
  void after_step(int64_t done);

  // Rank 0 alone writes the samples, the saves (every rank resumes from them) and the metrics; each rank its own
  // log and memory.json, in rank_dir_ (the run's folder for rank 0, rank<r>/ in it for the others).
  // `together`: every rank calls it (a save that is due, the last one); else rank 0 alone (on a failure), which
  // under ZeRO-1 cannot gather the other ranks' optimizer state: it saves nothing then, the last due save stands.
  std::optional<std::filesystem::path> save(int64_t step, bool final, bool together = true) {
    if (!final && session_.shards_optimizer()) {
      if (!together) {
        if (writes_)
          log::warn(
              "the optimizer's state is sharded across the ranks (--shard optimizer), which cannot all take "
              "part now: step " +
              std::to_string(step) + " is not saved; the newest save stands");
        return std::nullopt;
      }
      auto scope = session_.phase(Phase::save);  // what the gather holds is the save's
      session_.gather_optimizer_state();
    }
    if (!writes_) return std::nullopt;
    summary_.saves.push_back(saves_.save(session_, step, final));
    session_.drop_gathered_state();
    return summary_.saves.back();
  }
  // Data parallelism: at each save every rank's trained weights must be rank 0's (the same update on the same
  // averaged gradients); a rank apart is an error naming it, before rank 0 saves.
  void check_ranks_agree(int64_t step) {
    if (!group_) return;
    const std::vector<int> apart =
        group_->differing_from_rank0(session_.trained_fingerprint(), 1e-9, "comparing the ranks' weights");
    if (apart.empty()) return;
    std::string ranks;
    for (int r : apart) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw std::runtime_error("step " + std::to_string(step) + ": the trained weights of rank(s) " + ranks +
                             " differ from rank 0's: the ranks no longer train one model (a rank that resumed from "
                             "another save, or a kernel that is not deterministic across them)");
  }
  // Whether every rank is to stop (Ctrl-C reaches the ranks at different steps: they stop at one).
  bool stop_requested() const {
    const bool mine = options_.stop_requested && options_.stop_requested->load();
    return group_ ? group_->any(mine, "whether to stop") : mine;
  }

  const config::ProcessConfig& config_;
  const TrainOptions& options_;
  TrainSummary& summary_;
  std::filesystem::path rank_dir_;
  dist::ProcessGroup* group_;
  bool writes_;
  std::vector<config::DatasetConfig> datasets_;
  std::vector<data::ImageItem> items_;
  // The run's memory model, built before the run's Session (its meta build seeds the generator as a load
  // does; the Session then seeds it again) and without a word (the Session says what it has to say).
  std::unique_ptr<MemoryModel> predicted_;
  Session session_;
  RunSaves saves_;
  std::optional<RunLog> log_;
  std::optional<data::BatchLoader> loader_;  // its thread starts at the first batch, after the budget probe
  // The is_reg datasets' own loader (AI Toolkit's data_loader_reg, BaseSDTrainProcess.py:173-176), when
  // there are any: it gives the batches of the steps reg_step() names.
  std::optional<data::BatchLoader> reg_loader_;
  bool reg_step(int64_t step) const;
  int64_t step_ = 0;               // steps done
  int64_t last_good_step_ = 0;     // the parameters' step: what a save now would hold
  int64_t first_update_step_ = 0;  // the step whose update made the optimizer's state
  int consecutive_ooms_ = 0;
  std::vector<OomContext::Skipped> skipped_;  // the batches skipped out of memory, for the report
  int consecutive_nonfinite_ = 0;             // steps in a row whose every loss was not finite
};

void Run::prepare() {
  const config::TrainConfig& tc = config_.train;
  const Session& s = session_;
  log::info(s.spec().preset + ": " + std::to_string(model::parameter_count(session_.model())) + " parameters, " +
            std::to_string(model::trainable_parameter_count(session_.model())) + " trained" +
            (s.lora_modules() ? " (LoRA rank " + std::to_string(s.lora().rank) + " on " +
                                    std::to_string(s.lora_modules()) + " modules)"
                              : "") +
            "; checkpoint policy " + s.applied_policy().to_string() + "; " + s.device().str() +
            (s.bf16() ? ", bf16 (no autocast; LoRA adapters float32)" : ", fp32"));
  if (options_.resume) {
    if (const auto resumed = saves_.resume(session_))
      step_ = *resumed;
    else
      log::info("no earlier save in " + summary_.output_dir.string() + ": starting at step 0");
  }
  // Every rank resumes from the same save (a shared training_folder), or their steps would not pair up.
  if (group_)
    if (const auto apart = group_->differing_from_rank0(static_cast<double>(step_), 0, "comparing the resumed step");
        !apart.empty())
      throw UserError("rank " + std::to_string(apart.front()) + " resumes at another step than rank 0 (" +
                      std::to_string(step_) + " here): every rank must see the same training_folder " +
                      "(a shared file system across machines)");
  summary_.start_step = summary_.end_step = last_good_step_ = step_;
  // Rank 0 writes the run's metrics.jsonl; another rank its own memory, step by step, in rank<r>/.
  log_.emplace(rank_dir_, step_, tc.steps,
               ProgressOptions{writes_ ? options_.progress : nullptr, options_.progress_in_place}, predicted_.get(),
               writes_ ? "metrics.jsonl" : "memory_steps.jsonl");
  data::LoaderOptions lo;
  lo.batch_size = tc.batch_size;
  lo.divisibility = s.spec().divisibility;
  lo.temporal = static_cast<int>(s.spec().latent_temporal);
  lo.reference_area = s.spec().reference_area;
  const bool channels = model::family_of(s.spec().family).controls_as_channels(s.spec());
  lo.controls_at_bucket = channels || model::trains_references_at_image_size(s.spec());
  lo.raw_controls = s.spec().raw_references;
  lo.match_target_res = config_.model.model_kwargs.match_target_res;
  lo.inpaint_images = channels;
  lo.first_frame_latents = s.plan().first_frame_latents;
  lo.text_reads_controls = model::text_reads_controls(s.spec());
  lo.seed = s.plan().seed;
  lo.trigger_word = config_.trigger_word;
  lo.world_size = s.plan().world.size, lo.rank = s.plan().world.rank;
  std::vector<data::ImageItem> items, reg_items;
  for (const auto& item : items_)
    (datasets_[static_cast<size_t>(item.dataset)].is_reg ? reg_items : items).push_back(item);
  if (items.empty())
    throw data::DataError("every dataset is is_reg: there are no images to train on between its steps");
  // Where each loader starts: the micro-batches the earlier steps took from it.
  int64_t start = 0, reg_start = 0;
  for (int64_t k = 0; k < step_; ++k) (!reg_items.empty() && reg_step(k) ? reg_start : start) += s.accumulation();
  loader_.emplace(std::move(items), datasets_, session_.codec(), lo, start);
  if (!reg_items.empty()) reg_loader_.emplace(std::move(reg_items), datasets_, session_.codec(), lo, reg_start);
  // AI Toolkit's order (the datasets' setup_epoch, toolkit/data_loader.py:609-614, once the model, the
  // network and the optimizer's state are loaded): the latents, then the captions, each fill in the `cache`
  // phase with the transformer off the device (Session::CacheFill).
  const std::vector<data::Caption> captions = run_captions(items_, datasets_, config_.trigger_word);
  oom_guarded([&] {
    session_.cache_latents(*loader_);
    if (reg_loader_) session_.cache_latents(*reg_loader_);
    session_.precompute_text(captions);
  });
  log_->caches(session_, session_.precomputed_captions(captions));
  if (tc.budget_probe && tc.policy().kind == ckpt::CheckpointPolicy::Kind::Budget)
    oom_guarded([&] {
      const auto [measured, walked] = session_.probe_block_activations();
      log::info("budget probe: the blocks keep " + config::format_bytes(measured.total_off_bytes) +
                " without checkpointing at the largest batch and resolution; the walk says " +
                config::format_bytes(walked.total_off_bytes));
    });
  session_.phases().clear();
  // AI Toolkit's baseline: unless skip_first_sample, at the start of a fresh run, or at the step a run
  // resumes from under force_first_sample (BaseSDTrainProcess.py:2477-2481).
  if (session_.sampling() && !tc.skip_first_sample && (step_ == 0 || tc.force_first_sample))
    oom_guarded([&] { take_samples(step_); });
}

void Run::take_samples(int64_t at) {
  if (!writes_) return;  // the previews are rank 0's (they draw from their own generators: the ranks stay alike)
  const fs::path dir = summary_.output_dir / "samples";
  const auto files = session_.sample(at, dir);
  summary_.samples.insert(summary_.samples.end(), files.begin(), files.end());
  if (!files.empty())
    log::info("step " + std::to_string(at) + ": " + std::to_string(files.size()) + " sample(s) in " + dir.string());
}

void Run::loop() {
  for (; step_ < config_.train.steps; ++step_) {
    try {
      if (stop_requested()) {  // a collective: a rank lost since the last step is seen here
        summary_.interrupted = true;
        break;
      }
      train_one();
    } catch (const c10::OutOfMemoryError& e) {
      on_oom(e);  // abort: throws; skip: the step counts, with no update (AI Toolkit's step loop)
      summary_.end_step = last_good_step_ = step_ + 1;  // the last update's parameters, at this step's index
      oom_guarded([&] { after_step(step_ + 1); });
    } catch (const SaveError&) {
      throw;  // the previous save is intact; nothing more can be written
    } catch (const NonFiniteStop&) {
      throw;  // the saves before are the good ones: nothing is saved over them
    } catch (const std::exception& e) {
      // Anything else that ends the run (unusable data, a bug): the last good state first.
      log::error(std::string("stopping at step ") + std::to_string(step_ + 1) + ": " + e.what());
      if (group_ && !dynamic_cast<const dist::RankLost*>(&e)) group_->tell_others(e.what());
      if (last_good_step_ > summary_.start_step) save(last_good_step_, false, /*together=*/false);
      throw;
    }
  }
  log_->end_progress();
}

// AI Toolkit's regularization steps (BaseSDTrainProcess.py:2550-2568): with an is_reg dataset, every even
// step (0-based) takes its micro-batches from the reg loader, except the steps that save or sample.
bool Run::reg_step(int64_t step) const {
  if (step % 2 != 0) return false;
  const int save_every = config_.save.save_every;
  if (save_every > 0 && step % save_every == 0) return false;
  const auto& sample = config_.sample;
  const bool sampling = sample && !config_.train.disable_sampling && sample->sample_every > 0;
  return !(sampling && step >= sample->sample_start_step && step % sample->sample_every == 0);
}

void Run::train_one() {
  const int64_t done = step_ + 1;
  const auto t_step = Clock::now();
  data::BatchLoader& loader = reg_loader_ && reg_step(step_) ? *reg_loader_ : *loader_;
  const StepResult r = session_.train_step(step_, [&loader] {
    data::LoadedBatch b = loader.next();
    for (const auto& w : loader.take_warnings()) log::warn(w);
    return b;
  });
  last_good_step_ = done;
  if (r.before_first_update && r.updated) first_update_step_ = done;
  note_nonfinite(done, r);
  const double step_s = seconds_since(t_step);
  summary_.losses.push_back(r.loss);
  summary_.data_wait_s += r.data_wait_s;
  summary_.step_s += step_s;
  summary_.end_step = done;
  // Previews and saves belong to this step: their phase peaks go in its metrics line.
  after_step(done);
  log_->step(done, r, step_s, session_, summary_.oom_skips, summary_.nonfinite_steps);
  consecutive_ooms_ = 0;
  const int limit = config_.train.max_nonfinite_steps;
  if (limit > 0 && consecutive_nonfinite_ >= limit) {
    log_->end_progress();
    const auto newest = saves_.newest_state();
    throw NonFiniteStop(std::to_string(consecutive_nonfinite_) + " steps in a row had a loss that was not finite (" +
                        "the last at step " + std::to_string(done) +
                        "): stopped (train.max_nonfinite_steps: " + std::to_string(limit) +
                        "). The saves made before are intact" + (newest ? "; the newest is " + newest->string() : "") +
                        ". Lower train.lr, or check the data and the dtype");
  }
}

// A step's previews and saves, when due: after its update, and after a step skipped out of memory, as AI
// Toolkit's step loop samples and saves at a skipped step too.
void Run::after_step(int64_t done) {
  const auto& sample = config_.sample;
  if (session_.sampling() && done % sample->sample_every == 0 && done >= sample->sample_start_step) take_samples(done);
  if (done < config_.train.steps && done % config_.save.save_every == 0) {
    if (consecutive_nonfinite_ > 0)  // the good saves before it are not rotated away
      log::warn("step " + std::to_string(done) + ": save deferred: the loss was not finite");
    else
      check_ranks_agree(done), save(done, false);
  }
}

// AI Toolkit prints "loss is nan" and trains on (SDTrainer.py:2221-2224); gclab says which step, counts it
// for metrics.jsonl and report.html, and stops after train.max_nonfinite_steps of them in a row.
void Run::note_nonfinite(int64_t done, const StepResult& r) {
  if (r.nonfinite == 0) {
    consecutive_nonfinite_ = 0;
    return;
  }
  if (!r.all_nonfinite()) {
    consecutive_nonfinite_ = 0;
    log::warn("step " + std::to_string(done) + ": " + std::to_string(r.nonfinite) + " of " +
              std::to_string(session_.accumulation()) +
              " micro-batches' losses were not finite; left out of the update");
    return;
  }
  ++consecutive_nonfinite_;
  ++summary_.nonfinite_steps;
  log::warn("step " + std::to_string(done) +
            ": the loss is not finite; no gradient and no update, as AI Toolkit skips it (" +
            std::to_string(consecutive_nonfinite_) + " in a row)");
}

void Run::on_oom(const c10::OutOfMemoryError& e) {
  const auto live = session_.meter().stats();
  const ResidentBytes held = session_.resident();
  session_.zero_grad();
  const Phase phase = session_.current_phase();
  // The caches are filled before the step loop (AI Toolkit catches no OOM there), as the model is loaded.
  const bool in_step = phase != Phase::sample && phase != Phase::save && phase != Phase::cache && phase != Phase::setup;
  session_.meter().release_cached();  // what the failed step held goes back before anything else runs
  // AI Toolkit's step loop (BaseSDTrainProcess.py:2624-2647): an OOM in the step zeroes the gradients and
  // skips the batch — the step counts, with no update and no LR step — and the 4th in a row raises. An OOM
  // while sampling or saving is not caught there; here it stops with the report.
  // Under data parallelism a rank cannot skip alone (the others would wait for its gradients): it stops.
  if (config_.train.oom_policy == config::OomPolicy::skip && !group_ && in_step && ++consecutive_ooms_ <= 3) {
    ++summary_.oom_skips;
    skipped_.push_back({step_ + 1, phase, session_.current_bucket(), session_.current_batch()});
    log::warn("out of memory at step " + std::to_string(step_ + 1) + " in " + phase_name(phase) + " (bucket " +
              session_.current_bucket() + ", batch " + std::to_string(session_.current_batch()) + "); skipping batch " +
              std::to_string(consecutive_ooms_) + "/3 (train.oom_policy: skip)");
    log_->oom_skip(step_ + 1, phase, session_.current_bucket(), session_.current_batch(), summary_.oom_skips);
    session_.skip_scheduler_step();
    session_.phases().clear();
    session_.meter().reset_peak();
    return;
  }
  stop_out_of_memory(e, live, held);
}

void Run::stop_out_of_memory(const c10::OutOfMemoryError& e, const memory::MemoryStats& live,
                             const ResidentBytes& held) {
  OomContext ctx = oom_context(config_, session_.device(), e);
  ctx.step = step_ + 1;
  ctx.phase = session_.current_phase();
  ctx.activity = session_.current_activity();
  ctx.bucket = session_.current_bucket();
  ctx.batch = session_.current_batch();
  if (ctx.phase == Phase::sample)
    ctx.bucket = std::to_string(config_.sample->width) + "x" + std::to_string(config_.sample->height), ctx.batch = 1;
  ctx.live_bytes = live.live_bytes;
  ctx.peak_bytes = live.peak_bytes;
  ctx.weight_bytes = held.weights;
  ctx.gradient_bytes = held.gradients;
  ctx.optimizer_bytes = held.optimizer;
  ctx.text_encoder_bytes = held.text_encoder;
  ctx.vae_bytes = held.vae;
  ctx.image_encoder_bytes = held.image_encoder;
  ctx.last_step_phase_peaks = log_->last_step_peaks();
  ctx.last_good_step = last_good_step_;
  ctx.first_update_step = first_update_step_;
  ctx.skipped = skipped_;
  session_.lift_cap();  // nothing lost: the save is not part of the experiment
  try {
    if (const auto saved = save(last_good_step_, false, /*together=*/false)) ctx.saved_weights = saved->string();
  } catch (const std::exception& save_error) {
    log::error(std::string("could not save after the out-of-memory error: ") + save_error.what());
  }
  const std::string brief = write_oom_report(rank_dir_, ctx, recommend_fixes(ctx, config_, session_.codec_spec()));
  log_->end_progress();
  if (group_) group_->tell_others(brief);
  throw OutOfMemoryStop(brief);
}

void Run::finish() {
  // The last step's preview, as AI Toolkit ends a run, unless it was just taken.
  const int sample_every = config_.sample ? config_.sample->sample_every : 0;
  if (session_.sampling() && !summary_.interrupted && step_ > summary_.start_step && step_ % sample_every != 0)
    take_samples(step_);
  if (summary_.interrupted) log::info("stopped at step " + std::to_string(step_) + " (interrupted); saving");
  try {
    check_ranks_agree(step_);
  } catch (const dist::RankLost&) {  // the steps are done: rank 0 saves them alone before it stops
    if (step_ > summary_.start_step) save(step_, false, /*together=*/false);
    throw;
  }
  if (consecutive_nonfinite_ > 0)
    log::warn("the last " + std::to_string(consecutive_nonfinite_) +
              " steps' losses were not finite: the weights saved now are those of the last update before them");
  save(step_, false);  // the state for --resume
  if (!summary_.interrupted) save(step_, true);
  summary_.unusable_images = loader_->unusable_files();
  if (reg_loader_)
    for (auto& f : reg_loader_->unusable_files()) summary_.unusable_images.push_back(f);
  for (const auto& f : summary_.unusable_images) log::warn("not used (cannot be decoded): " + f);
  summary_.peak_bytes = log_->peak_bytes();
  log_->write_memory(session_);
  if (group_) group_->barrier("the end of the run");  // rank 0's last saves are written when any rank returns
}

}  // namespace

TrainSummary train(const config::ProcessConfig& config, const TrainOptions& options) {
  const auto t_start = Clock::now();
  TrainSummary summary;
  summary.output_dir = fs::path(config.training_folder) / config.name;
  // Data parallelism: every rank runs this; rank 0 holds the folder and writes the run's files, each other rank
  // its log and memory (memory.json, memory_steps.jsonl) in rank<r>/.
  const dist::World& world = dist::process_world();
  const fs::path rank_dir =
      world.writes_outputs() ? summary.output_dir : summary.output_dir / ("rank" + std::to_string(world.rank));
  std::optional<RunFolderLock> lock;
  if (world.writes_outputs()) lock.emplace(summary.output_dir);  // before anything in the folder is written
  fs::create_directories(summary.output_dir / "samples");
  fs::create_directories(rank_dir);
  if (world.writes_outputs()) std::ofstream(summary.output_dir / "config.resolved.yaml") << config::to_yaml(config);
  log::add_file((rank_dir / "log.txt").string());
  struct LogFileScope {
    ~LogFileScope() { log::remove_files(); }
  } log_file_scope;

  // The allocator's history from before the load to the run's end, written however the run ends: while the
  // run still holds its memory (the blocks live at its end, or when it ran out), else once the load failed.
  struct Snapshot {
    fs::path file;
    c10::Device device;
    bool written = false;
    void write() noexcept {
      if (file.empty() || written) return;
      written = true;
      try {
        memory::write_memory_snapshot(file, device);
        memory::stop_memory_history(device);
        log::info("memory snapshot: " + file.string() + " (open it in pytorch.org/memory_viz)");
      } catch (const std::exception& e) {
        log::warn(std::string("memory snapshot not written: ") + e.what());
      }
    }
    ~Snapshot() { write(); }
  } snapshot{dist::process_world().writes_outputs() || options.memory_snapshot.empty()
                 ? options.memory_snapshot
                 : options.memory_snapshot.parent_path() /
                       (options.memory_snapshot.stem().string() + ".rank" + std::to_string(dist::process_world().rank) +
                        options.memory_snapshot.extension().string()),
             runs_on_cuda(config)
                 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(dist::process_world().local_rank))
                 : c10::Device(c10::kCPU)};
  if (!snapshot.file.empty()) memory::start_memory_history(snapshot.device);
  std::unique_ptr<dist::ProcessGroup> group;
  if (!world.alone()) {
    const c10::Device device = runs_on_cuda(config)
                                   ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank))
                                   : c10::Device(c10::kCPU);
    group = dist::ProcessGroup::join(world, device, options.dist_timeout);
    log::info(world.name() + ": joined the " + group->backend() + " process group at " + world.master_addr + ":" +
              std::to_string(world.master_port) + "; each rank trains on " + std::to_string(config.train.batch_size) +
              " of every global batch of " + std::to_string(config.train.batch_size * world.size));
  }
  try {
    const char* outer = memory::set_history_frame("setup");    // the history's frame for the load
    Run run(config, options, summary, rank_dir, group.get());  // scans the data, builds the session
    memory::set_history_frame(outer);
    struct WriteFirst {
      Snapshot& s;
      ~WriteFirst() { s.write(); }
    } write_first{snapshot};
    run.prepare();
    run.loop();
    run.finish();
  } catch (const std::exception& e) {
    // What stops this rank, told to the others before it leaves: their collectives fail at once (its connections
    // close) and their errors say why.
    if (group && !dynamic_cast<const dist::RankLost*>(&e)) group->tell_others(e.what());
    throw;
  }
  summary.total_s = seconds_since(t_start);
  return summary;
}

}  // namespace gclab::train
