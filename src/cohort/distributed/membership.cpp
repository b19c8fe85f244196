#include "cohort/distributed/membership.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "cohort/core/sha256.hpp"
#include "cohort/distributed/store.hpp"

namespace cohort {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string text_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string gen_key(int g, const char* what) { return detail::cat("g", g, "/", what); }

// The newest generation announced; 0 before any.
int announced(c10d::Store& store) { return store.check({"gen"}) ? std::stoi(text_of(store.get("gen"))) : 0; }

std::string encode_all(const std::vector<Member>& members) {
  std::string out;
  for (const auto& m : members) out += m.encode() + "\n";
  return out;
}

std::vector<Member> decode_all(const std::string& text) {
  std::vector<Member> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(Member::decode(line));
  }
  return out;
}

// Node keys whose every local rank is among `regs`.
std::set<std::string> complete_nodes(const std::vector<Member>& regs) {
  std::map<std::string, int> count, want;
  for (const auto& m : regs) {
    ++count[m.node_key];
    want[m.node_key] = m.local_world_size;
  }
  std::set<std::string> out;
  for (const auto& [key, n] : count) {
    if (n == want[key]) out.insert(key);
  }
  return out;
}

bool has(const std::vector<Member>& v, const std::string& id) {
  return std::any_of(v.begin(), v.end(), [&](const Member& m) { return m.id == id; });
}

std::string describe(const Member& m) {
  return detail::cat(m.prev_rank >= 0 ? detail::cat("rank ", m.prev_rank, " ") : std::string(), "(node ", m.node,
                     ", local rank ", m.local_rank, ")");
}

}  // namespace

std::string elastic_env(const ElasticOptions& eo) {
  return detail::cat(eo.nnodes, ":", eo.min_nodes, ":", eo.max_nodes);
}

ElasticOptions parse_elastic_env(const std::string& text) {
  ElasticOptions eo;
  char c1 = 0, c2 = 0;
  std::istringstream in(text);
  in >> eo.nnodes >> c1 >> eo.min_nodes >> c2 >> eo.max_nodes;
  COHORT_CHECK(!in.fail() && c1 == ':' && c2 == ':' && eo.min_nodes >= 1 && eo.nnodes >= eo.min_nodes, UsageError,
               "COHORT_ELASTIC must be NNODES:MIN:MAX (got '", text, "')");
  return eo;
}

std::string Member::encode() const {
  return detail::cat(id, " ", node, " ", local_rank, " ", local_world_size, " ", node_key, " ", step, " ", prev_rank,
                     " ", config.empty() ? "-" : config);
}

Member Member::decode(const std::string& text) {
  Member m;
  std::istringstream in(text);
  in >> m.id >> m.node >> m.local_rank >> m.local_world_size >> m.node_key >> m.step >> m.prev_rank >> m.config;
  if (m.config == "-") m.config.clear();
  COHORT_CHECK(!in.fail(), DistError, "elastic: unreadable member record '", text, "' in the store");
  return m;
}

std::shared_ptr<Membership> Membership::join(const RankSpec& spec, const CommOptions& opts, ElasticOptions eo) {
  COHORT_CHECK(spec.init.kind == InitMethod::Kind::kTcp, UsageError,
               "elastic training (--min-nodes) needs --init-method tcp://HOST:PORT (got ", spec.init.text, ")");
  std::shared_ptr<Membership> m(new Membership());
  m->spec_ = spec;
  m->opts_ = opts;
  m->eo_ = std::move(eo);
  std::random_device rd;
  m->id_ = detail::cat("n", spec.node_rank, ".", spec.local_rank, ".", std::hex, rd(), rd());

  const Clock::time_point deadline = Clock::now() + opts.timeout;
  auto connect = [&]() -> c10::intrusive_ptr<c10d::Store> {
    for (;;) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      try {
        auto s = open_tcp_store(spec.init.host, spec.init.port, /*server=*/false,
                                std::clamp(left, milliseconds(1), milliseconds(1000)));
        s->setTimeout(opts.timeout);
        return s;
      } catch (const std::exception& e) {
        COHORT_CHECK(Clock::now() < deadline, DistError, "node ", spec.node_rank, " local rank ", spec.local_rank,
                     ": cannot reach the rendezvous store at ", spec.init.text, " within ",
                     opts.timeout.count() / 1000.0, " s: ", detail::first_line(e.what()));
        COHORT_CHECK(!(opts.interrupted && opts.interrupted()), DistError,
                     "interrupted while connecting to the rendezvous store at ", spec.init.text);
      }
    }
  };
  auto base = connect(), hb_base = connect();
  // The secret: the first process publishes its proof, everyone compares.
  std::string proof = sha256_hex("cohort-proof:" + opts.secret);
  std::string proof_key = "cohort/proof/" + std::to_string(opts.generation);
  std::string theirs = text_of(base->compareSet(proof_key, {}, bytes_of(proof)));
  COHORT_CHECK(theirs == proof, UsageError, "refused by the job at ", spec.init.text,
               ": its secret differs from ours. Set the same --dist.secret or COHORT_SECRET on every node.");
  std::string prefix = detail::cat("cohort/", sha256_hex(opts.secret).substr(0, 16), "/", opts.generation, "/elastic");
  m->base_ = base;
  m->hb_base_ = hb_base;
  m->store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, base);
  m->hb_store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, hb_base);
  Membership* raw = m.get();
  m->heartbeat_ = std::thread([raw] { raw->beat(); });
  return m;
}

Membership::~Membership() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // A buried group's threads may be blocked until dist.timeout: at exit they
  // are left to the OS rather than joined.
  for (auto& g : graveyard_) g.release();
}

std::string Membership::why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_.empty() ? "the world changed" : why_;
}

void Membership::announce(const std::string& why) {
  int g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g = generation_;
  }
  announce_on(*store_, g, why);
}

void Membership::announce_on(c10d::Store& store, int g, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (why_.empty()) why_ = why;
  }
  changed_ = true;
  if (g < 0) return;
  try {
    // The reason first, then the generation: a member that sees gen move
    // reads why/G at once, and must find it (it once read "another member
    // announced a change" when it looked between the two writes).
    std::string why_key = detail::cat("why/", g + 1);
    if (!store.check({why_key})) store.set(why_key, bytes_of(why));
    // gen moves from whatever it is (never backwards) to g + 1.
    std::string want = std::to_string(g + 1);
    for (int now = announced(store), tries = 0; now <= g && tries < 100; now = announced(store), ++tries) {
      store.compareSet("gen", now == 0 && !store.check({"gen"}) ? std::vector<uint8_t>{} : bytes_of(std::to_string(now)),
                       bytes_of(want));
    }
  } catch (const std::exception&) {
    // The store's host is gone: next_world reports it.
  }
}

void Membership::bury(c10::intrusive_ptr<c10::intrusive_ptr_target> group) {
  std::lock_guard<std::mutex> lock(mu_);
  graveyard_.push_back(std::move(group));
}

void Membership::beat() {
  int64_t beats = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    try {
      hb_store_->set("hb/" + id_, bytes_of(std::to_string(++beats)));
      hb_base_->add("launch/beat", 1);  // node 0's launcher: someone still works
      watch_peers(*hb_store_);
    } catch (const std::exception&) {
      // The store's host is gone; the next collective or formation says so.
    }
    lock.lock();
    cv_.wait_for(lock, opts_.heartbeat, [&] { return stop_; });
  }
}

// In a world: a newer generation announced elsewhere, a member whose
// heartbeat stood still for five beats, and newcomers waiting to join.
void Membership::watch_peers(c10d::Store& store) {
  std::lock_guard<std::mutex> beats_lock(beats_mu_);
  auto& seen = peer_beats_;
  std::vector<Member> world;
  int g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!in_world_) return;
    world = world_;
    g = generation_;
  }
  if (peer_beats_generation_ != g) {
    seen.clear();
    peer_beats_generation_ = g;
  }
  int now_gen = announced(store);
  if (now_gen > g) {
    std::string why_key = detail::cat("why/", now_gen);
    std::string why = store.check({why_key}) ? text_of(store.get(why_key)) : "another member announced a change";
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (why_.empty()) why_ = why;
    }
    changed_ = true;
    return;
  }
  const auto now = Clock::now();
  const auto lost_after = opts_.heartbeat * 5;
  for (size_t r = 0; r < world.size(); ++r) {
    const Member& m = world[r];
    if (m.id == id_) continue;
    std::string key = "hb/" + m.id;
    std::string value = store.check({key}) ? text_of(store.get(key)) : "";
    auto it = seen.find(m.id);
    if (it == seen.end() || it->second.first != value) {
      seen[m.id] = {value, now};
    } else if (now - it->second.second > lost_after && !changed_) {
      announce_on(store, g, detail::cat("rank ", r, " (node ", m.node, ") stopped beating for ",
                                        std::chrono::duration<double>(now - it->second.second).count(),
                                        " s (dead or stalled)"));
      return;
    }
  }
  // Newcomers: admitted when a whole node of them waits, beats and runs the
  // job's config, and the world has room. (A half-arrived node, a stopped
  // newcomer or another config would end the world for nothing.)
  std::set<std::string> nodes;
  for (const auto& m : world) nodes.insert(m.node_key);
  if (joiners_waiting_ || store.add(gen_key(g + 1, "count"), 0) == 0 ||
      (eo_.max_nodes > 0 && static_cast<int>(nodes.size()) >= eo_.max_nodes)) {
    return;
  }
  std::vector<Member> ready;
  for (auto& m : registrants(store, g + 1)) {
    std::string key = "hb/" + m.id;
    std::string value = store.check({key}) ? text_of(store.get(key)) : "";
    auto it = seen.find(m.id);
    if (it == seen.end() || it->second.first != value) seen[m.id] = {value, now};
    bool alive = seen[m.id].second + opts_.heartbeat * 3 > now && !store.check({"gone/" + m.id});
    if (alive && m.config == eo_.config && !nodes.count(m.node_key)) ready.push_back(std::move(m));
  }
  if (!complete_nodes(ready).empty()) joiners_waiting_ = true;
}

void Membership::finish() {
  try {
    store_->set("done", bytes_of("1"));
    base_->set("launch/done", bytes_of("1"));  // the launchers: stop ranks left behind
  } catch (const std::exception&) {
  }
}

std::vector<Member> Membership::registrants(c10d::Store& store, int g) {
  std::vector<Member> out;
  int64_t count = store.add(gen_key(g, "count"), 0);
  for (int64_t i = 0; i < count; ++i) {
    std::string key = detail::cat(gen_key(g, "slot/"), i);
    if (store.check({key})) out.push_back(Member::decode(text_of(store.get(key))));
  }
  return out;
}

std::vector<Member> Membership::decide(const std::vector<Member>& regs, const std::vector<Member>& prev) const {
  auto complete = complete_nodes(regs);
  std::vector<Member> holders, newcomers;
  for (const auto& m : regs) {
    if (!complete.count(m.node_key)) continue;
    (m.step >= 0 && m.prev_rank >= 0 && has(prev, m.id) ? holders : newcomers).push_back(m);
  }
  std::sort(holders.begin(), holders.end(), [](const Member& a, const Member& b) {
    // The least advanced first: a collective that completed on some ranks
    // only (the last step before a loss) leaves the others one step behind,
    // and their logs lack that step; going on from the step every survivor
    // completed retrains it once, with every log line.
    return a.step != b.step ? a.step < b.step : a.prev_rank < b.prev_rank;
  });
  // Newcomers run the job's config: the survivors' (the first world's
  // differences are the trainer's start-up check to name).
  if (!holders.empty() || !prev.empty()) {
    const std::string& job = (holders.empty() ? prev : holders)[0].config;
    newcomers.erase(std::remove_if(newcomers.begin(), newcomers.end(),
                                   [&](const Member& m) { return m.config != job; }),
                    newcomers.end());
  }
  std::sort(newcomers.begin(), newcomers.end(), [](const Member& a, const Member& b) {
    return std::tie(a.node, a.node_key, a.local_rank, a.id) < std::tie(b.node, b.node_key, b.local_rank, b.id);
  });
  std::vector<Member> out;
  std::set<std::string> nodes;
  for (const auto* group : {&holders, &newcomers}) {
    for (const auto& m : *group) {
      if (!nodes.count(m.node_key) && eo_.max_nodes > 0 && static_cast<int>(nodes.size()) >= eo_.max_nodes) continue;
      nodes.insert(m.node_key);
      out.push_back(m);
    }
  }
  return out;
}

std::unique_ptr<Comm> Membership::next_world(int64_t step) {
  try {
    return form_next(step);
  } catch (const Error&) {
    try {  // a registration left behind must not be admitted
      store_->set("gone/" + id_, bytes_of("1"));
    } catch (const std::exception&) {
    }
    throw;
  } catch (const std::exception& e) {
    throw DistError(detail::cat("node ", spec_.node_rank, " local rank ", spec_.local_rank, ": lost the rendezvous "
                                "store at ", spec_.init.text, " while the world was forming (node 0's launcher "
                                "hosts it: the job ended or node 0 is gone): ", detail::first_line(e.what())));
  }
}

namespace {

// This process's registration: `step` is handed on only by a member of `prev`.
Member self_member(const std::string& id, const RankSpec& spec, const ElasticOptions& eo, int64_t step,
                   const std::vector<Member>& prev) {
  Member me;
  me.id = id;
  me.node = spec.node_rank;
  me.local_rank = spec.local_rank;
  me.local_world_size = spec.local_world_size;
  me.node_key = eo.node_key;
  me.step = step;
  me.config = eo.config;
  for (size_t r = 0; r < prev.size(); ++r) {
    if (prev[r].id == id) me.prev_rank = static_cast<int>(r);
  }
  if (me.prev_rank < 0) me.step = -1;  // only a member's state can be handed on
  return me;
}

// Generation g - 1's members: `prev` when it was ours, else as the store has them.
std::vector<Member> members_before(c10d::Store& store, const std::vector<Member>& prev, int prev_gen, int g) {
  std::vector<Member> before = prev;
  if (prev_gen != g - 1 && g > 0 && store.check({gen_key(g - 1, "members")})) {
    before = decode_all(text_of(store.get(gen_key(g - 1, "members"))));
  }
  return before;
}

// What forming generation g (`decided`, after `prev`) did; its wall time aside.
WorldChange change_of(int g, const std::vector<Member>& prev, const std::vector<Member>& decided,
                      const std::string& cause) {
  WorldChange change;
  change.generation = g;
  change.members = decided;
  change.cause = cause;
  std::set<std::string> nodes;
  for (size_t r = 0; r < decided.size(); ++r) {
    nodes.insert(decided[r].node_key);
    if (!has(prev, decided[r].id)) {
      change.joined.push_back(decided[r]);
      change.joined.back().prev_rank = static_cast<int>(r);  // described by its new rank
    }
  }
  for (size_t r = 0; r < prev.size(); ++r) {
    if (has(decided, prev[r].id)) continue;
    change.left.push_back(prev[r]);
    change.left.back().prev_rank = static_cast<int>(r);
  }
  change.nodes = static_cast<int>(nodes.size());
  change.state_survived = decided[0].step >= 0 && decided[0].prev_rank >= 0;
  return change;
}

// Member `id`'s place in `decided`; its device aside.
World world_of(const std::vector<Member>& decided, const std::string& id) {
  World world;
  world.world_size = static_cast<int>(decided.size());
  for (size_t r = 0; r < decided.size(); ++r) {
    if (decided[r].id != id) continue;
    world.rank = static_cast<int>(r);
    world.local_rank = decided[r].local_rank;
    world.local_world_size = decided[r].local_world_size;
    world.node_rank = decided[r].node;
  }
  return world;
}

}  // namespace

// One generation forming, as this process watches it.
struct Membership::Forming {
  Forming(const Member& self, const std::vector<Member>& previous) : me(self), before(previous) {}

  const Member& me;                   // this process's registration
  const std::vector<Member>& before;  // the previous generation's members
  const Clock::time_point opened = Clock::now();
  Clock::time_point all_silent_since = Clock::time_point::max();
  Clock::time_point last_note = opened;
  std::map<std::string, std::pair<std::string, Clock::time_point>> beats;  // see await_members
};

std::unique_ptr<Comm> Membership::form_next(int64_t step) {
  const Clock::time_point started = Clock::now();
  std::vector<Member> prev;
  int prev_gen;
  std::string cause;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prev = in_world_ ? world_ : std::vector<Member>{};
    prev_gen = in_world_ ? generation_ : -1;
    cause = why_;
    in_world_ = false;
  }
  Member me = self_member(id_, spec_, eo_, step, prev);

  int g;
  if (prev_gen >= 0) {
    announce_on(*store_, prev_gen, cause.empty() ? "nodes asked to join" : cause);
    g = prev_gen + 1;
  } else {
    g = announced(*store_);
    if (store_->check({gen_key(g, "members")})) ++g;  // it runs already: join the next one
  }

  std::vector<Member> decided;
  for (;;) {  // one generation per pass: a process left out of one asks for the next
    std::vector<Member> before = members_before(*store_, prev, prev_gen, g);
    COHORT_CHECK(before.empty() || before[0].config == me.config || me.prev_rank >= 0, UsageError, "node ",
                 spec_.node_rank, ": the running job at ", spec_.init.text, " has another shared config than this "
                 "node's; start it with the job's config (docs/configuration.md: Scopes)");
    std::optional<std::vector<Member>> members = await_members(g, me, before);
    if (!members) return nullptr;
    decided = std::move(*members);
    if (has(decided, id_)) break;
    COHORT_CHECK(decided.empty() || decided[0].config == me.config, UsageError, "node ", spec_.node_rank,
                 ": the running job at ", spec_.init.text, " has another shared config than this node's; start it "
                 "with the job's config (docs/configuration.md: Scopes)");
    // Left out (late, or judged silent): ask for the next generation as a newcomer.
    me.prev_rank = -1;
    me.step = -1;
    prev = decided;
    prev_gen = g;
    ++g;
  }

  // This generation's world.
  WorldChange change = change_of(g, prev, decided, cause);
  World world = world_of(decided, id_);
  change.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  world.device = resolve_device(opts_.device, world.local_rank);
  return enter(g, decided, world, change);
}

std::optional<std::vector<Member>> Membership::await_members(int g, const Member& me,
                                                             const std::vector<Member>& before) {
  int64_t slot = store_->add(gen_key(g, "count"), 1) - 1;
  store_->set(detail::cat(gen_key(g, "slot/"), slot), bytes_of(me.encode()));
  Forming forming(me, before);
  // Heartbeats: each value and when it last moved, as the heartbeat
  // thread saw them (the previous world's members, and newcomers waiting
  // for this generation), then as we watch. Silent: still for three beats,
  // or said it left (gone/ID, a newcomer that was stopped).
  {
    std::lock_guard<std::mutex> lock(beats_mu_);
    if (peer_beats_generation_ == g - 1) forming.beats = peer_beats_;
  }
  for (;;) {
    COHORT_CHECK(!(opts_.interrupted && opts_.interrupted()), DistError, "node ", spec_.node_rank,
                 ": interrupted while the world was forming");
    if (store_->check({gen_key(g, "members")})) {
      return decode_all(text_of(store_->get(gen_key(g, "members"))));
    }
    if (store_->check({"done"})) return std::nullopt;
    const auto now = Clock::now();
    std::vector<Member> regs;
    for (auto& m : registrants(*store_, g)) {
      if (!silent(forming, m.id, now)) regs.push_back(std::move(m));
    }
    if (closes(forming, regs, now)) {
      auto members = decide(regs, before);
      if (!members.empty()) store_->compareSet(gen_key(g, "members"), {}, bytes_of(encode_all(members)));
      continue;
    }
    if (me.prev_rank < 0 && now - forming.last_note > std::chrono::seconds(30)) {
      forming.last_note = now;
      std::fprintf(stderr, "cohort: node %d local rank %d: waiting to join the job at %s (generation %d)\n",
                   spec_.node_rank, spec_.local_rank, spec_.init.text.c_str(), g);
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
}

bool Membership::silent(Forming& forming, const std::string& id, Clock::time_point now) const {
  if (id == id_) return false;
  if (store_->check({"gone/" + id})) return true;
  std::string key = "hb/" + id;
  std::string value = store_->check({key}) ? text_of(store_->get(key)) : "";
  auto it = forming.beats.find(id);
  if (it == forming.beats.end() || it->second.first != value) {
    forming.beats[id] = {value, now};
    return false;
  }
  return now - it->second.second >= opts_.heartbeat * 3;
}

bool Membership::closes(Forming& forming, const std::vector<Member>& regs, Clock::time_point now) const {
  auto complete = complete_nodes(regs);
  // A node half in (its other ranks still on their way) gets two seconds.
  std::set<std::string> arriving;
  for (const auto& m : regs) arriving.insert(m.node_key);
  bool settled = complete.size() == arriving.size() || now - forming.opened > std::chrono::seconds(2);
  bool close = false;
  if (forming.before.empty()) {
    // The first world: --nnodes nodes, or after dist.timeout at least --min-nodes.
    if (static_cast<int>(complete.size()) >= eo_.nnodes && settled) close = true;
    if (now - forming.opened > opts_.timeout) {
      COHORT_CHECK(static_cast<int>(complete.size()) >= eo_.min_nodes, BelowMinNodes, "node ", spec_.node_rank,
                   ": only ", complete.size(), " of --nnodes ", eo_.nnodes, " node(s) arrived at ",
                   spec_.init.text, " within dist.timeout ", opts_.timeout.count() / 1000.0, " s (--min-nodes ",
                   eo_.min_nodes, ")");
      close = true;
    }
  } else {
    // The previous world's members that have not asked: gone when silent.
    bool all_gone = true;
    for (const auto& m : forming.before) {
      if (!has(regs, m.id) && !silent(forming, m.id, now)) all_gone = false;
    }
    // A member that beats but never asks (stuck elsewhere) is waited for
    // at most dist.timeout, and only by members: a newcomer never closes
    // a world whose members still beat (it waits to be admitted).
    if (!all_gone && forming.me.prev_rank >= 0 && now - forming.opened > opts_.timeout) all_gone = true;
    // The countdown to BelowMinNodes runs only while all are gone: a
    // member that beats again restarts it.
    if (!all_gone) forming.all_silent_since = Clock::time_point::max();
    if (all_gone && forming.all_silent_since == Clock::time_point::max()) forming.all_silent_since = now;
    if (all_gone && settled) {
      if (static_cast<int>(complete.size()) >= eo_.min_nodes) {
        close = true;
      } else if (now - forming.all_silent_since > opts_.timeout) {
        throw BelowMinNodes(detail::cat("node ", spec_.node_rank, ": only ", complete.size(),
                                        " node(s) remain, fewer than --min-nodes ", eo_.min_nodes,
                                        ", and no node joined within dist.timeout ",
                                        opts_.timeout.count() / 1000.0, " s"));
      }
    }
  }
  return close;
}

std::unique_ptr<Comm> Membership::enter(int g, const std::vector<Member>& decided, const World& world,
                                        const WorldChange& change) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed_ = false;
    joiners_waiting_ = false;
    world_ = decided;
    generation_ = g;
    in_world_ = true;
    why_.clear();
  }
  change_ = change;
  auto group = c10::make_intrusive<c10d::PrefixStore>(gen_key(g, "gloo"), store_);
  auto comm = Comm::form(world, spec_, opts_, group, shared_from_this());
  if (announced(*store_) > g) changed_ = true;  // a change announced while we formed
  return comm;
}

std::string describe_members(const std::vector<Member>& members) {
  std::string out;
  for (const auto& m : members) out += (out.empty() ? "" : ", ") + describe(m);
  return out;
}

}  // namespace cohort
