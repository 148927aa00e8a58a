#include "gclab/train/predict.h"

#include <algorithm>
#include <set>

#include "gclab/data/buckets.h"
#include "gclab/data/image.h"
#include "gclab/memory/live_set.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/activations.h"
#include "gclab/model/family.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"
#include "gclab/nn/layers.h"
#include "gclab/sample/sampler.h"
#include "gclab/text/prompt.h"
#include "gclab/train/session.h"

namespace gclab::train {

namespace {

// Control images as the text encoders' prediction reads them: [3, H, W] meta tensors of the files' sizes
// (a file that cannot be read is left out, as the run leaves it out).
text::ConditionImages image_shapes(const std::vector<std::filesystem::path>& files) {
  text::ConditionImages out;
  for (const auto& f : files)
    if (const auto size = data::read_image_size(f))
      out.push_back(torch::empty({3, size->height, size->width}, torch::TensorOptions().device(torch::kMeta)));
  return out;
}

// Each of the step's captions' encode peaks (PromptEncoder::predict_encode), or one 77-token caption's.
std::vector<int64_t> caption_encode_peaks(const Session& session, const MemoryEstimate& e,
                                          const std::vector<data::Caption>& captions, bool cpu) {
  const text::PromptEncoder* prompts = session.text_encoder();
  if (captions.empty() || !prompts) return {e.text ? e.text->encode_bytes : 0};
  text::EncodeMemoryOptions kernels;
  kernels.cpu = cpu;
  std::vector<int64_t> peaks;
  for (const data::Caption& c : captions) {
    const text::ConditionImages conditions =
        c.control_images.empty() ? image_shapes(c.control_files) : c.control_images;
    peaks.push_back(prompts->predict_encode(c.text, conditions, kernels).peak_bytes);
  }
  return peaks;
}

// The text phase's encode for the step's captions (encoded one at a time), or a 77-token caption's.
int64_t caption_encode_bytes(const Session& session, const MemoryEstimate& e,
                             const std::vector<data::Caption>& captions, bool cpu) {
  int64_t peak = 0;
  for (const int64_t p : caption_encode_peaks(session, e, captions, cpu)) peak = std::max(peak, p);
  return peak;
}

// The text phase walked, above what the data phase left on the device: the step's conditioning as
// TextEmbeddingCache::collate runs it (data/conditioner.h, called from Session::conditioning) for `shape.batch`
// captions of `rows` rows, each caption's embedding in the encoders' dtype — made on the device after its encode's peak
// (PromptEncoder::predict_encode: the prompt's encode walked) when the encoders stay, else read from the cache in host
// memory —, the earlier ones kept while the next is made, then side by side on the device.
int64_t walk_text_phase(const Session& session, const MemoryEstimate& e, const model::SampleShape& shape, int64_t rows,
                        const std::vector<data::Caption>& captions, bool cpu) {
  if (!e.text) return 0;
  const model::ModelSpec& spec = session.spec();
  std::vector<int64_t> peaks(static_cast<size_t>(shape.batch), e.text->encode_bytes);
  if (e.text->every_step && static_cast<int64_t>(captions.size()) == shape.batch)
    peaks = caption_encode_peaks(session, e, captions, cpu);
  const auto o = torch::TensorOptions().device(torch::kMeta).dtype(e.text->dtype);
  memory::MetaCount count(cpu ? c10::kCPU : c10::kCUDA);
  memory::run_walk([&] {
    data::TextEmbeddingCache::collate(std::vector<int64_t>(peaks.size(), rows), torch::kMeta, [&](size_t i) {
      std::optional<memory::HostScope> host;
      if (e.text->every_step)
        memory::meta_spike(peaks[i]);
      else
        host.emplace();
      return data::TextEmbedding{torch::empty({1, rows, spec.text_dim}, o),
                                 spec.pooled_dim > 0 ? torch::empty({1, spec.pooled_dim}, o) : torch::Tensor(),
                                 torch::Tensor()};  // a text mask ([1, rows] int64, Chroma's) is not counted
    });
  });
  return count.peak();
}

// The step's forward and backward, walked: the flow-matching step (train/flow.h) run on the Session's
// meta model under `policy` (applied through the run's own checkpointing, restored after) and counted by a
// memory::MetaCount standing for the run's device — every op's output and temporaries, what autograd and
// the checkpoints keep, the recompute, the gradients as the backward makes them. Its inputs are the
// micro-batch's device tensors: the latents, noise and timesteps in float32, the text embeddings in
// `text_dtype` (the encoders', as they and the cache give them), the control latents. Returns each phase's peak above
// what stays between steps (the micro-batch included, made before the forward); with gradient accumulation the trained
// tensors' gradients exist before the backward (the earlier micro-batches'), and are counted with what stays. Offloaded
// layers (model.layer_offloading): their ring slots hold the Linears that ran last between steps; the walk runs twice,
// the first to fill the meta rings as a run's are when a step begins, and `rings` is what they hold then (the resident
// bytes' estimate of them is replaced by it).
struct WalkedStep {
  int64_t forward = 0, backward = 0, rings = 0;
  int64_t batch = 0;              // the micro-batch's tensors, before the forward
  std::set<std::string> reached;  // the trained tensors the backward gave a gradient
  // A model of several experts: those whose gradients one step can hold at once — one expert's (the
  // largest), or with gradient_accumulation, whose micro-batches may cross a switch, every trained expert's.
  std::set<std::string> held_gradients;
};

WalkedStep walk_step(Session& session, const ckpt::CheckpointPolicy& policy, const model::SampleShape& shape,
                     int64_t text_tokens, c10::ScalarType text_dtype,
                     const std::vector<std::vector<int64_t>>& references, bool cuda) {
  if (policy.kind == ckpt::CheckpointPolicy::Kind::Budget)
    throw std::invalid_argument("the memory model walks a budget policy once it is resolved to blocks:[...]");
  model::DiffusionTransformer& model = session.model();
  const ckpt::CheckpointPolicy applied = session.applied_policy();
  session.apply_policy(policy, shape);
  const bool accumulates = session.accumulation() > 1;
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat);
  if (accumulates)
    for (const auto& [name, p] : session.trained()) p.mutable_grad() = torch::empty_like(p);
  WalkedStep walked;
  const bool offloads = nn::offload_device_bytes(model, 1) > 0;
  // A model of several experts runs one expert a micro-batch: each trained expert walked, the larger kept.
  std::vector<int> experts = {-1};
  if (model.expert_count() > 1) {
    experts.clear();
    for (size_t e : session.trained_experts()) experts.push_back(static_cast<int>(e));
  }
  for (const int expert : experts) {
    std::set<std::string> reached;
    for (int pass = offloads ? 0 : 1; pass < 2; ++pass) {
      if (pass == 1) walked.rings = nn::offload_buffer_bytes(session.offload_rings());
      memory::MetaCount count(cuda ? c10::kCUDA : c10::kCPU);
      MicroBatch mb;
      mb.conditioning = model.example_inputs(shape, text_tokens, meta);
      mb.conditioning.expert = expert;
      for (torch::Tensor* t : {&mb.conditioning.text, &mb.conditioning.pooled})  // as the text phase gives them
        if (t->defined()) *t = torch::empty(t->sizes(), meta.dtype(text_dtype));
      mb.x0 = std::move(mb.conditioning.latents);
      mb.t = std::move(mb.conditioning.timestep);
      mb.noise = torch::empty_like(mb.x0);
      mb.weight = torch::empty({shape.batch}, meta);
      mb.conditioning.bypass_guidance = model::training_bypasses_guidance(session.spec(), session.config().train);
      for (const auto& shape : references) mb.conditioning.reference_latents.push_back(torch::empty(shape, meta));
      model::FirstFrames first;  // an image-to-video model's first frames, conditioned on in the forward phase
      first.clips = shape.frames > 1;
      if (session.conditions_on_first_frame()) {
        mb.conditioning.condition_channels = mb.conditioning.image_embeds = torch::Tensor();
        memory::HostScope host;  // the loader's, as the pixels or from the latent cache
        if (session.first_frames_cached())
          first.latents =
              torch::empty(model::latent_shape(session.spec(), {shape.batch, 1, shape.height, shape.width}), meta);
        else
          first.pixels = torch::empty({shape.batch, 3, shape.height, shape.width}, meta);
      }
      walked.batch = count.live();
      StepOptions so;
      so.loss_type = session.config().train.loss_type;
      so.dtype = session.plan().compute_dtype;
      // An op without a meta kernel ends the walk (memory::run_walk): the peaks counted before it stand, lower
      // bounds, and the op is named in not_modelled.
      torch::Tensor loss;
      const bool forward_ran = memory::run_walk([&] {
        if (session.conditions_on_first_frame()) session.condition_on_first_frame(mb.conditioning, first, mb.x0, 0);
        loss = flow_matching_loss(model, mb, so);
      });
      // The second pass's (the rings as a step leaves them), the largest expert's.
      const int64_t forward = count.peak();
      count.reset_peak();
      if (forward_ran) memory::run_walk([&] { loss.backward(); });
      if (pass == 1)
        walked.forward = std::max(walked.forward, forward), walked.backward = std::max(walked.backward, count.peak());
      reached.clear();
      for (const auto& [name, p] : session.trained()) {
        if (p.grad().defined()) reached.insert(name);
        if (!accumulates) p.mutable_grad() = torch::Tensor();
      }
    }
    walked.reached.insert(reached.begin(), reached.end());
    if (accumulates || reached.size() > walked.held_gradients.size()) {
      if (!accumulates) walked.held_gradients.clear();
      walked.held_gradients.insert(reached.begin(), reached.end());
    }
  }
  for (const auto& [name, p] : session.trained()) p.mutable_grad() = torch::Tensor();
  session.apply_policy(applied, shape);
  return walked;
}

StepEstimate step_estimate(Session& session, const MemoryEstimate& e, const model::ActivationEstimate& a,
                           const model::PolicyActivations& kept, const ckpt::CheckpointPolicy& policy,
                           const model::SampleShape& shape, bool cpu, const std::vector<data::Caption>& captions) {
  const model::ModelSpec& spec = session.spec();
  StepEstimate s;
  s.activation_bytes = kept.peak_bytes;
  // The data phase, walked (Session::walk_inputs): the batch as the loader gives it through the step's own
  // encode — the autoencoder's, when latents are not cached (the frames copied to the device in its dtype,
  // then encoded), and the control images' every step (an edit model's, Flex.2's control folders).
  const Session::InputWalk inputs = session.walk_inputs(shape);
  s.encode_bytes = inputs.data;
  s.reference_bytes = inputs.references;
  // An edit model's control latents as the step's forward reads them: the data phase's, one per control image.
  std::vector<std::vector<int64_t>> reference_shapes;
  if (spec.reference_tokens) reference_shapes = inputs.reference_shapes;
  // The text phase holds what the data phase left on the device (inputs.held: latents encoded there, control
  // latents) and the step's conditioning, walked.
  if (e.text) s.text_bytes = inputs.held + walk_text_phase(session, e, shape, a.text_tokens, captions, cpu);
  // Between steps the gradients are gone (zero_grad sets them to None); everything else resident stays.
  // With gradient_accumulation the micro-batches after the first run beside the gradients the earlier ones
  // left (summed into, not freed), and an optimizer that accumulates stochastically sets them aside through
  // each later backward (one more set beside the new ones).
  // The forward and the backward, walked op by op on the meta model (walk_step); model.layer_offloading's
  // rings as the walk leaves them between steps (walked.rings), in every phase a step holds them.
  const WalkedStep walked =
      walk_step(session, policy, shape, a.text_tokens, e.text ? e.text->dtype : c10::kFloat, reference_shapes, !cpu);
  s.forward_bytes = walked.forward, s.backward_bytes = walked.backward;
  s.batch_bytes = walked.batch;
  const int64_t held = e.resident_bytes - e.offload_buffer_bytes + walked.rings;
  const bool accumulates = session.accumulation() > 1;
  const int64_t steady = held - (accumulates ? 0 : e.gradient_bytes);
  const int64_t aside = accumulates && session.optimizer().accumulates_stochastically() ? e.gradient_bytes : 0;
  s.phases[memory::Phase::data] = steady + s.encode_bytes;
  s.phases[memory::Phase::text] = steady + s.text_bytes;
  const int64_t backward = std::max(steady + walked.backward, held) + aside;
  s.phases[memory::Phase::forward] = steady + walked.forward;
  s.phases[memory::Phase::backward] = backward;
  s.phases[memory::Phase::optimizer] = held + e.optimizer_step_bytes;
  s.first_phases = s.phases;
  for (const memory::Phase p : {memory::Phase::data, memory::Phase::text, memory::Phase::forward})
    s.first_phases[p] -= e.optimizer_bytes;
  const RunPlan& plan = session.plan();
  if (plan.previews.empty() || plan.config.train.skip_first_sample)  // the first use is the step's forward
    for (const memory::Phase p : {memory::Phase::data, memory::Phase::text}) s.first_phases[p] -= e.parked_bytes;
  if (e.image_encoder_waits)  // brought by the first step's forward (and after each preview, which sends it back)
    for (const memory::Phase p : {memory::Phase::data, memory::Phase::text}) s.first_phases[p] -= e.image_encoder_bytes;
  s.first_phases[memory::Phase::backward] = backward - e.optimizer_bytes;
  for (const auto& [phase, bytes] : s.phases) s.total_bytes = std::max(s.total_bytes, bytes);
  for (const auto& [phase, bytes] : s.first_phases) s.first_total_bytes = std::max(s.first_total_bytes, bytes);
  return s;
}

LoadEstimate load_of(const LoadMemory& load) {
  LoadEstimate l;
  l.quantized_on_host = load.quantized_on_host;
  l.at_first_use = load.at_first_use;
  l.device_peak_bytes = load.device.peak();
  l.host_peak_bytes = load.host.peak();
  return l;
}

// What stays on the device through the steps, and in host memory.
void resident_estimate(Session& session, MemoryEstimate& e) {
  const bool leaves = session.plan().text_encoder_leaves;
  const ResidentBytes r = session.resident();
  e.weight_bytes = r.weights;
  e.trained = model::trainable_parameter_count(session.model());
  e.trained_bytes = r.trained;
  // One gradient and the optimizer's state per trained tensor the step's backward reaches (walked once, at
  // the first cell): a tensor no loss depends on — Qwen-Image's last block's text-stream output projection
  // and MLP, whose output the model drops — gets neither, as in a run (torch.optim makes no state without a
  // gradient).
  const model::ModelSpec& spec = session.spec();
  const StepCell first = session.plan().cells.empty() ? StepCell{1, 4 * static_cast<int>(spec.divisibility)}
                                                      : session.plan().cells.front();
  std::vector<std::vector<int64_t>> references;
  if (spec.reference_tokens)
    references.push_back(model::latent_shape(spec, {first.batch, 1, first.bucket_height(), first.bucket_width()}));
  const WalkedStep walked =
      walk_step(session, ckpt::CheckpointPolicy::off(), first.shape(), 0, c10::kFloat, references, session.plan().cuda);
  const std::set<std::string>& reached = walked.reached;
  e.gradient_bytes = 0;
  for (const auto& [name, p] : session.trained())
    if (walked.held_gradients.count(name)) e.gradient_bytes += static_cast<int64_t>(p.nbytes());  // in its dtype
  // The optimizer's state and its step's temporaries: its own step walked twice on meta copies of them.
  const c10::DeviceType target = session.plan().cuda ? c10::kCUDA : c10::kCPU;
  const Optimizer::Walk optimizer = session.optimizer().walk(reached, std::nullopt, target);
  e.optimizer_bytes = optimizer.state_bytes;
  // A model of several experts steps the adapters one expert's micro-batches reached (their temporaries).
  e.optimizer_step_bytes = walked.held_gradients == reached
                               ? optimizer.step_bytes
                               : session.optimizer().walk(walked.held_gradients, std::nullopt, target).step_bytes;
  // ZeRO-1: the updated weights' broadcast after the update, in the same phase: its buffers walked.
  if (session.shards_optimizer())
    e.optimizer_step_bytes =
        std::max(e.optimizer_step_bytes, memory::inference_peak(target, [&] { session.gather_updated_weights(); }));
  // The EMA's update runs after the optimizer's, in the same phase: its float32 copies walked.
  if (r.ema > 0)
    e.optimizer_step_bytes =
        std::max(e.optimizer_step_bytes,
                 memory::inference_peak(session.plan().cuda ? c10::kCUDA : c10::kCPU, [&] { session.update_ema(); }));
  e.ema_bytes = r.ema;
  e.text_encoder_bytes = leaves ? 0 : r.text_encoder;
  e.vae = session.codec_spec().describe();
  e.vae_weight_bytes = session.codec_spec().weight_bytes();
  e.vae_bytes = r.vae;
  e.image_encoder_bytes = r.image_encoder;
  e.image_encoder_waits = session.first_frame_encoder_waits();
  // Host memory: the offloaded weights, the text encoders' while they stay loaded.
  e.host_weight_bytes = r.host_weights + (leaves ? 0 : r.text_encoder_host);
  e.offload_buffer_bytes = nn::offload_device_bytes(session.model(), config::dtype_bytes(session.config().train.dtype));
  e.gradient_bucket_bytes = r.gradient_buckets;
  e.world_size = session.plan().world.size;
  e.optimizer_sharded = session.shards_optimizer();
  for (const auto& block : session.model().blocks()) {
    int64_t trained = 0;
    for (const auto& p : block->parameters())
      if (p.requires_grad()) trained += static_cast<int64_t>(p.nbytes());
    if (const int64_t bytes = nn::module_bytes(*block); bytes > e.largest_block_weight_bytes)
      e.largest_block_weight_bytes = bytes, e.largest_block_trained_bytes = trained;
  }
  e.resident_bytes = e.weight_bytes + e.gradient_bytes + e.optimizer_bytes + e.ema_bytes + e.text_encoder_bytes +
                     e.vae_bytes + e.image_encoder_bytes + e.offload_buffer_bytes + e.gradient_bucket_bytes;
  e.load = load_of(session.load_memory());
  if (e.load.at_first_use)  // two experts: the base weights of the first to run (its adapters are there)
    e.parked_bytes = session.model().expert_count() > 1
                         ? session.expert_swap_bytes()
                         : e.weight_bytes - (session.config().network ? e.trained_bytes : 0);
}

// A nominal caption's encode, when the text encoders stay.
void text_estimate(Session& session, MemoryEstimate& e, bool cuda) {
  const text::PromptEncoder* prompts = session.text().encoder();
  const ResidentBytes r = session.resident();
  if (prompts && prompts->slots() > 0) {
    TextEncodeEstimate t;
    t.caption_tokens = model::kNominalCaptionTokens;
    t.control_images = model::text_reads_controls(e.spec) ? 1 : 0;
    const text::EncodePrediction p = predict_caption_encode(*prompts, e.spec, !cuda);
    for (size_t i = 0; i < prompts->slots(); ++i) t.encoders.push_back(model::text_encoder_folder(i));
    t.tokens = p.tokens, t.bytes = p.bytes, t.encode_bytes = p.peak_bytes, t.dtype = p.dtype;
    t.every_step = !session.plan().text_encoder_leaves;
    if (!t.every_step)
      t.total_bytes =
          e.resident_bytes - e.gradient_bytes - e.optimizer_bytes - e.parked_bytes + r.text_encoder + t.encode_bytes;
    e.text = t;
  }
}

// One cache fill (Session::CacheFill) before the first step: what is resident then, less what the fill takes
// off the device (the Session's own rule), plus the fill's work.
int64_t cache_fill_bytes(Session& session, const MemoryEstimate& e, CacheFill fill,
                         const std::vector<data::Caption>& captions, bool cpu) {
  const ResidentBytes r = session.resident();
  const int64_t before = r.weights - e.parked_bytes + r.ema + r.text_encoder + e.offload_buffer_bytes +
                         r.gradient_buckets + (e.image_encoder_waits ? 0 : r.image_encoder) -
                         session.cache_parked_bytes(fill);
  if (fill == CacheFill::text) return before + caption_encode_bytes(session, e, captions, cpu);
  model::SampleShape largest;  // the largest sample a cell has (AI Toolkit encodes them one at a time)
  for (const StepCell& c : session.plan().cells)
    if (int64_t{c.frames} * c.bucket_width() * c.bucket_height() > largest.frames * largest.height * largest.width)
      largest = {1, c.frames, c.bucket_height(), c.bucket_width()};
  return before + session.walk_latent_fill(largest);  // the autoencoder's weights come back in it
}

// The fills the run makes: latents when a dataset caches them and the autoencoder encodes (the stand-in
// encodes on the loader's thread), captions under cache_text_embeddings.
void cache_estimate(Session& session, MemoryEstimate& e, bool cuda) {
  const bool latents = session.caches_latents() && session.codec_spec().autoencoder.has_value();
  const bool text = session.plan().caches_text && session.text_encoder() != nullptr;
  if (!latents && !text) return;
  CacheEstimate c;
  for (const StepCell& cell : session.plan().cells)
    c.resolution = std::max(c.resolution, cell.resolution), c.frames = std::max(c.frames, cell.frames);
  if (latents) c.latents_bytes = cache_fill_bytes(session, e, CacheFill::latents, {}, !cuda);
  if (text) c.text_bytes = cache_fill_bytes(session, e, CacheFill::text, {}, !cuda);
  c.total_bytes = std::max(c.latents_bytes, c.text_bytes);
  e.cache = c;
  if (text && e.text) e.text->total_bytes = c.text_bytes;  // the captions' encode before training is this fill
}

// The preview: its denoising passes, the decode, the control images' encode, the prompts' encode.
// The sizes an edit model's preview `i` encodes its control images (files) at: the reference area of each
// image's aspect (preview_reference_size, as Session::preview_references loads them).
std::vector<data::BucketResolution> preview_control_sizes(const Session& session, size_t i) {
  const sample::SampleOptions so = session.preview_options(i);
  std::vector<data::BucketResolution> out;
  for (const auto& f : session.plan().preview_controls.at(i))
    if (const auto size = data::read_image_size(f))
      out.push_back(preview_reference_size(session.spec(), {size->width, size->height}, static_cast<int>(so.width),
                                           static_cast<int>(so.height)));
  return out;
}

// The preview's denoising, walked: one step of the sampler (sample::euler_sample, the code a preview runs)
// on the meta model for each preview's prompt and negative prompt — their text rows as the pipeline gives
// them (PromptEncoder::rows; so CFG runs the two as one batch only when their lengths agree, as the sampler
// decides), an edit model's reference latents — counted above what was live before, the conditioning
// included. Without the text encoders in the session (cached prompts) a prompt has the family's nominal
// caption's rows.
int64_t walk_preview_denoise(Session& session, bool cuda) {
  const config::ProcessConfig& config = session.config();
  const auto& sc = *config.sample;
  const model::ModelSpec& spec = session.spec();
  const text::PromptEncoder* prompts = session.text().encoder();
  const auto& items = session.plan().previews;
  const auto& files = session.plan().preview_controls;
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat);
  auto rows = [&](const std::string& prompt, const text::ConditionImages& conditions) -> int64_t {
    if (!spec.text_dim) return 0;
    const int64_t n =
        prompts ? prompts->rows(prompt, conditions) : model::encoder_tokens(spec, model::kNominalCaptionTokens);
    return model::sequence_rows(spec, n);
  };
  std::set<std::vector<int64_t>> walked;  // (frames, height, width, guidance x 1000, rows, rows, references...)
  int64_t peak = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& item = items[i];
    const sample::SampleOptions so = session.preview_options(i, {std::nullopt, std::nullopt, 1});
    const text::ConditionImages conditions =
        spec.reference_tokens ? image_shapes(files.at(i)) : text::ConditionImages{};
    std::vector<int64_t> key{so.frames,
                             so.height,
                             so.width,
                             static_cast<int64_t>(so.guidance_scale * 1000),
                             rows(item.prompt, conditions),
                             rows(item.neg.value_or(sc.neg), conditions)};
    std::vector<std::vector<int64_t>> references;
    if (spec.reference_tokens)
      for (const data::BucketResolution& ref : preview_control_sizes(session, i)) {
        references.push_back(model::latent_shape(spec, {1, 1, ref.height, ref.width}));
        key.insert(key.end(), {ref.height, ref.width});
      }
    // An image-to-video preview's first frame (its own encode walked apart: walk_preview_controls): what it
    // gives the denoise — Wan 2.2 TI2V's per-token timesteps and clean first frame among them.
    const model::ModelInputs first = session.walk_preview_first_frame(i);
    key.push_back(first.per_token_timesteps);
    key.push_back(first.clean_latent_frames.defined() ? first.clean_latent_frames.size(2) : 0);
    if (!walked.insert(key).second) continue;
    memory::MetaCount count(cuda ? c10::kCUDA : c10::kCPU);
    const model::SampleShape shape{1, so.frames, so.height, so.width};
    model::ModelInputs cond = session.model().example_inputs(shape, key[4], meta);
    model::ModelInputs uncond = session.model().example_inputs(shape, key[5], meta);
    for (model::ModelInputs* in : {&cond, &uncond}) {
      in->per_token_timesteps = first.per_token_timesteps;
      if (first.clean_latent_frames.defined())
        in->clean_latent_frames = torch::empty(first.clean_latent_frames.sizes(), meta.dtype(so.dtype));
    }
    for (const auto& shape : references) cond.reference_latents.push_back(torch::empty(shape, meta.dtype(so.dtype)));
    uncond.reference_latents = cond.reference_latents;
    memory::run_walk([&] { sample::euler_sample(session.model(), cond, uncond, so); });
    peak = std::max(peak, count.peak());
  }
  return peak;
}

void preview_estimate(Session& session, MemoryEstimate& e, bool cuda) {
  const config::ProcessConfig& config = session.config();
  const text::PromptEncoder* prompts = session.text().encoder();
  text::EncodeMemoryOptions kernels;
  kernels.cpu = !cuda;
  if (config.sample && !config.train.disable_sampling && !config.sample->samples.empty()) {
    const auto& sc = *config.sample;
    PreviewEstimate p;
    const int d = e.spec.preview_divisibility;
    p.width = sc.width / d * d, p.height = sc.height / d * d;
    p.frames = static_cast<int>(session.plan().family->preview_frames(e.spec, session.config().model, sc.num_frames));
    for (size_t i = 0; i < session.plan().previews.size(); ++i)  // a prompt's --num_frames may ask for more
      p.frames = std::max(p.frames, static_cast<int>(session.preview_options(i).frames));
    const model::SampleShape shape{1, p.frames, p.height, p.width};
    p.image_tokens = model::image_tokens(e.spec, shape);
    p.denoise_bytes = walk_preview_denoise(session, cuda);
    // The decode and the frames' conversion to uint8, and each preview's control images encoded: walked
    // (Session::walk_preview_decode, walk_preview_controls).
    p.decode_bytes = session.walk_preview_decode(shape);
    for (size_t i = 0; i < session.plan().previews.size(); ++i)
      p.reference_encode_bytes = std::max(p.reference_encode_bytes, session.walk_preview_controls(i));
    // Without cached prompts the preview encodes each prompt (and its negative) with its control images.
    if (prompts && e.text && e.text->every_step)
      for (size_t i = 0; i < sc.samples.size(); ++i) {
        const text::ConditionImages conditions =
            e.spec.reference_tokens ? image_shapes(session.plan().preview_controls.at(i)) : text::ConditionImages{};
        for (const std::string& prompt : {sc.samples[i].prompt, sc.samples[i].neg.value_or(sc.neg)})
          p.text_encode_bytes =
              std::max(p.text_encode_bytes, prompts->predict_encode(prompt, conditions, kernels).peak_bytes);
      }
    // An image encoder that waits in host memory (model.low_vram) is on the device for the control's encode only.
    const int64_t away = e.image_encoder_waits ? e.image_encoder_bytes : 0;
    // Two experts under low_vram: neither on the device for the decode (Wan22Pipeline's unload).
    const int64_t expert = session.expert_swap_bytes();
    p.total_bytes =
        e.resident_bytes - e.gradient_bytes - away + (e.vae_weight_bytes - e.vae_bytes) +
        std::max({p.denoise_bytes, p.decode_bytes - expert, p.reference_encode_bytes + away, p.text_encode_bytes});
    e.preview = p;
  }
}

// The save: the run's resident bytes between steps, the state the weights file is written from (walked:
// model::lora_state — a LoRA's scaled adapters, conversions to save.dtype — or model::weights_state, run on
// the meta model), and with EMA the live trained tensors kept aside while the EMA weights are saved (the
// safetensors bytes themselves are serialised in host memory).
int64_t save_estimate(Session& session, const MemoryEstimate& e) {
  const torch::ScalarType dtype = save_dtype(session.config());
  const int64_t state = memory::inference_peak(session.plan().cuda ? c10::kCUDA : c10::kCPU, [&] {
    const auto tensors = session.config().network ? model::lora_state(session.model(), dtype)
                                                  : model::weights_state(session.model(), dtype);
  });
  return e.resident_bytes - e.gradient_bytes + state + (e.ema_bytes > 0 ? e.trained_bytes : 0);
}

void not_modelled(const RunPlan& plan, MemoryEstimate& e, bool cuda) {
  const config::ProcessConfig& config = plan.config;
  e.not_modelled = {
      "host memory: the data loader's prefetched batches and the latent cache (on a CPU run too: "
      "memory/placement.h), the sample prompts' cached embeddings (the captions' are on disk in _t_e_cache/, as "
      "AI Toolkit's: only a batch's reach the device), the process itself",
      "the text phase is predicted for a " + std::to_string(model::kNominalCaptionTokens) +
          "-token caption and the activations for its tokens (a run's own steps are predicted for their "
          "captions: metrics.jsonl, memory.json); longer captions of Qwen-Image / Z-Image hold more",
      "allocator fragmentation and the CUDA context (CUDA)",
      "the load's host memory as AI Toolkit's from_pretrained holds it: it reads every transformer into host "
      "memory first (load.host_peak counts only where the transformer is quantized there)"};
  if (!plan.world.alone())
    e.not_modelled.push_back(
        "data parallelism: the collectives' own buffers (Gloo's, NCCL's communicators on a GPU) and, under "
        "--shard optimizer, the whole optimizer state a save gathers at rank 0 (host memory; the device's on a CPU "
        "run: the save phase)");
  if (cuda)
    e.not_modelled.push_back(
        "the step's forward and backward are walked with the CUDA kernels' outputs (fused attention: its output "
        "and log-sum-exp; LayerNorm's float32 statistics) but not their workspaces (cuBLAS, the attention "
        "backward's accumulators), and are not yet checked against a GPU's allocator; the autoencoder's encode "
        "and decode likewise hold no cuDNN workspace");
  if (!cuda) {
    const int64_t dtype_bytes = config.train.dtype == config::DType::bf16 ? 2 : 4;
    if (!memory::cpu_rules_measured(dtype_bytes)) e.not_modelled.push_back(memory::cpu_rules_caveat(dtype_bytes));
  }
  if (!cuda && config.train.dtype == config::DType::bf16 && memory::cpu_onednn_bf16())
    e.not_modelled.push_back(
        "oneDNN's scratch beside each bf16 matmul of the backward on this CPU (AVX-512 BW/VL/DQ: "
        "memory/live_set.h; the forwards' is walked), held for a moment: per thread about 128 bytes per "
        "contraction element (up to 512) and 256 per row (up to 256 rows), more for a transposed operand; the tiny "
        "presets' bf16 backwards measure up to 18% above their walk");
  if (plan.load.quantized_on_host && plan.load.after_text_encoders && config.model.quantize)
    e.not_modelled.push_back(
        "the load: quantize_model stages each block on the device to quantize it; gclab quantizes the blocks in "
        "host memory (one block's weights less on the device meanwhile, below the text encoders' load)");
  if (e.preview && e.preview->reference_encode_bytes > 0 && config.model.low_vram && e.spec.reference_tokens &&
      model::low_vram_tiles_previews(e.spec))
    e.not_modelled.push_back(
        "low_vram: AI Toolkit's edit previews run with the VAE's tiling on, which tiles the ctrl_img's encode too; "
        "gclab encodes it whole (vae_encode_control is the untiled peak)");
}

}  // namespace

LoadEstimate estimate_load(const config::ProcessConfig& config) {
  return load_of(predict_load(plan_run(config, PlanOptions{/*meta=*/true})));
}

namespace {

RunPlan meta_plan(RunPlan plan) {
  if (!plan.device.is_meta())
    throw std::invalid_argument("the memory model executes a plan for the meta device (PlanOptions::meta)");
  memory::take_meta_gaps();  // from here on, the gaps of this model's walks (its load's included)
  return plan;
}

}  // namespace

MemoryModel::MemoryModel(const config::ProcessConfig& config) : MemoryModel(plan_run(config, PlanOptions{true})) {}

MemoryModel::MemoryModel(RunPlan plan) : session_(std::make_unique<Session>(meta_plan(std::move(plan)))) {
  Session& session = *session_;
  const config::ProcessConfig& config = session.config();
  MemoryEstimate& e = estimate_;
  e.spec = session.spec();
  resident_estimate(session, e);
  e.cap_bytes = config.vram_cap.bytes;
  e.activation_dtype = std::string(config::name_of(config.train.dtype));
  cuda_ = session.plan().cuda;
  e.device = cuda_ ? "cuda" : "cpu";  // the kind of device predicted for ("auto" resolved as the plan did)
  text_estimate(session, e, cuda_);
  cache_estimate(session, e, cuda_);
  // The phases no checkpoint policy changes, before auto weighs the step's against the cap with them.
  preview_estimate(session, e, cuda_);
  e.save_bytes = save_estimate(session, e);
  if (const RunPlan& plan = session.plan(); plan.policy.kind == ckpt::CheckpointPolicy::Kind::Auto) {
    e.auto_plan = auto_plan(plan.policy, plan.largest.shape(), plan.auto_cap_bytes, plan.auto_cap_source);
    session.set_auto_choice(e.auto_plan->chosen);
    session.apply_policy(session.plan().policy, session.plan().largest.shape());
  }
  e.policy = policy();
  // Each of the datasets' (batch, resolution) cells, checkpointing off and full.
  for (const StepCell& c : session.plan().cells) {
    ResolutionEstimate re;
    re.resolution = c.resolution;
    re.batch = c.batch;
    re.frames = c.frames;
    re.gc_off = step(c.shape(), ckpt::CheckpointPolicy::off());
    re.gc_full = step(c.shape(), ckpt::CheckpointPolicy::full());
    const auto kind = policy().kind;
    if (kind != ckpt::CheckpointPolicy::Kind::Off && kind != ckpt::CheckpointPolicy::Kind::Full)
      re.gc_run = step(c.shape(), policy());
    const model::StepTokens tokens = model::step_tokens(e.spec, c.shape());
    re.image_tokens = tokens.image;
    re.text_tokens = tokens.text;
    e.resolutions.push_back(re);
  }
  not_modelled(session.plan(), e, cuda_);
  for (const std::string& op : memory::take_meta_gaps())
    e.not_modelled.push_back("the walk met " + op +
                             ", which has no meta kernel here: the phases walked through it are lower bounds (the "
                             "peak counted before it)");
}

MemoryModel::~MemoryModel() = default;

StepEstimate MemoryModel::step(const model::SampleShape& shape, const ckpt::CheckpointPolicy& policy,
                               int64_t text_tokens, const std::vector<data::Caption>& captions) const {
  const model::ActivationEstimate a = session_->block_activations(shape, text_tokens);
  // The walked blocks' sums describe the step (what the blocks keep); the selective modes split a block:
  // the step's walk alone prices them.
  const model::PolicyActivations kept = model::activations_under(a, policy).value_or(model::PolicyActivations{});
  return step_estimate(*session_, estimate_, a, kept, policy, shape, !cuda_, captions);
}

const ckpt::CheckpointPolicy& MemoryModel::policy() const { return session_->applied_policy(); }

PhaseBytes MemoryModel::phases(const StepEstimate& step) const {
  PhaseBytes p = step.phases;
  p[memory::Phase::setup] = estimate_.load.device_peak_bytes;
  if (estimate_.cache) p[memory::Phase::cache] = estimate_.cache->total_bytes;
  if (estimate_.preview) p[memory::Phase::sample] = estimate_.preview->total_bytes;
  p[memory::Phase::save] = estimate_.save_bytes;
  return p;
}

PhaseBytes MemoryModel::run_phases(const StepEstimate& step) const {
  PhaseBytes p = phases(step);
  for (const auto& [phase, bytes] : step.first_phases) p[phase] = std::max(p[phase], bytes);
  return p;
}

int64_t MemoryModel::run_peak(const StepEstimate& step) const {
  int64_t peak = 0;
  for (const auto& [phase, bytes] : run_phases(step)) peak = std::max(peak, bytes);
  return peak;
}

int64_t MemoryModel::cache(const std::set<CacheFill>& fills, const std::vector<data::Caption>& captions) const {
  std::vector<data::Caption> distinct;  // one encode per caption text and control images
  std::set<std::string> seen;
  for (const auto& c : captions) {
    std::string key = c.text;
    for (const auto& f : c.control_files) key += "|" + f.string();
    if (seen.insert(key).second) distinct.push_back(c);
  }
  int64_t peak = 0;
  for (const CacheFill fill : fills)
    peak = std::max(peak, cache_fill_bytes(*session_, estimate_, fill, distinct, !cuda_));
  return peak;
}

PhaseBytes MemoryModel::predict(const StepResult& r) const {
  // Every logged step: the phases alone, without the blocks' own walk (the `activations` figure, no phase's).
  const model::SampleShape shape{r.batch, r.frames, r.height, r.width};
  const model::StepTokens tokens = model::step_tokens(estimate_.spec, shape, r.text_tokens);
  model::ActivationEstimate counted;
  counted.image_tokens = tokens.image, counted.text_tokens = tokens.text;
  StepEstimate s = step_estimate(*session_, estimate_, counted, {}, policy(), shape, !cuda_, r.captions);
  if (r.before_first_update) s.phases = s.first_phases;
  PhaseBytes p = phases(s);
  p.erase(memory::Phase::cache);  // before the steps: RunLog::caches predicts it for the fills the run made
  return p;
}

MemoryEstimate estimate_memory(const config::ProcessConfig& config) { return MemoryModel(config).estimate(); }

MemoryEstimate estimate_memory_grid(const config::ProcessConfig& config, const std::vector<int>& frames,
                                    const std::vector<int>& resolutions) {
  for (int f : frames)
    if (f < 1) throw UserError("--frames: " + std::to_string(f) + " is not a frame count (1 or more)");
  for (int r : resolutions)
    if (r < 8) throw UserError("--resolution: " + std::to_string(r) + " is below 8");
  if (frames.empty() && resolutions.empty()) return estimate_memory(config);
  // Each cell a config of its own (0: the config's own frames or resolutions), re-planned whole: its budget
  // resolved and its cache filled there.
  const std::vector<int> fs = frames.empty() ? std::vector<int>{0} : frames;
  const std::vector<int> rs = resolutions.empty() ? std::vector<int>{0} : resolutions;
  MemoryEstimate out;
  int64_t largest = -1;
  for (int f : fs)
    for (int r : rs) {
      config::ProcessConfig c = config;
      for (auto& d : c.datasets) {
        if (f > 0) d.num_frames = f, d.auto_frame_count = false;  // a row at f frames, whatever the clips' lengths
        if (r > 0) d.resolution = {r};
      }
      MemoryEstimate e = estimate_memory(c);
      const bool first = largest < 0;
      std::vector<ResolutionEstimate> rows = std::move(e.resolutions);
      const int64_t sample = int64_t{std::max(f, 1)} * std::max(r, 1) * std::max(r, 1);
      if (first) out = std::move(e);
      if (!first && sample > largest && e.cache) out.cache = e.cache;  // the largest sample's fill
      largest = std::max(largest, sample);
      out.resolutions.insert(out.resolutions.end(), rows.begin(), rows.end());
    }
  return out;
}

}  // namespace gclab::train
