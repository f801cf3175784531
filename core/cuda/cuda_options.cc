#include "core/cuda/cuda_options.h"

#include <array>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// The environment variables CudaOptionsFromEnv reads (and nothing else does).
constexpr char kEngineEnv[] = "ATTNSERVE_ATTENTION_ENGINE";
constexpr char kFlashKernelEnv[] = "ATTNSERVE_FLASH_KERNEL";
constexpr char kSm90VariantEnv[] = "ATTNSERVE_SM90_VARIANT";
constexpr char kSm90MaxCtasEnv[] = "ATTNSERVE_SM90_V3_MAX_CTAS";
constexpr char kSm90OrderEnv[] = "ATTNSERVE_SM90_V3_ORDER";
constexpr char kSm90ItemDealEnv[] = "ATTNSERVE_SM90_V3_ITEM_DEAL";

absl::Status Invalid(std::string_view what, std::string_view expected, std::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(what), ": expected ", std::string(expected), ", got '", std::string(got), "'"));
}

// The variable's value, or empty when unset (empty and unset both mean "keep the base value").
std::string_view EnvValue(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string_view(value) : std::string_view();
}

// An option's values with their names (what flags and environment variables say, and logs
// print), "auto" first: both directions come from the one list, and an empty name means auto.
template <typename E, size_t N>
using NameList = std::array<std::pair<E, std::string_view>, N>;

template <typename E, size_t N>
std::string_view NameIn(const NameList<E, N>& names, E value) {
  for (const auto& [e, name] : names) {
    if (e == value) return name;
  }
  return names[0].second;
}

template <typename E, size_t N>
absl::StatusOr<E> ParseIn(const NameList<E, N>& names, std::string_view name,
                          std::string_view what) {
  if (name.empty()) return names[0].first;
  for (const auto& [e, n] : names) {
    if (n == name) return e;
  }
  std::string expected;  // "auto, own or cudnn"
  for (size_t i = 0; i < N; ++i) {
    expected += i == 0 ? "" : (i + 1 == N ? " or " : ", ");
    expected += names[i].second;
  }
  return Invalid(what, expected, name);
}

constexpr NameList<AttentionEngine, 3> kEngineNames = {{
    {AttentionEngine::kAuto, "auto"}, {AttentionEngine::kOwn, "own"},
    {AttentionEngine::kCudnn, "cudnn"}}};
constexpr NameList<FlashKernelArch, 3> kArchNames = {{
    {FlashKernelArch::kAuto, "auto"}, {FlashKernelArch::kSm80, "sm80"},
    {FlashKernelArch::kSm90, "sm90"}}};
constexpr NameList<Sm90ItemOrder, 3> kItemOrderNames = {{
    {Sm90ItemOrder::kAuto, "auto"}, {Sm90ItemOrder::kPosition, "position"},
    {Sm90ItemOrder::kHead, "head"}}};
constexpr NameList<Sm90ItemDeal, 3> kItemDealNames = {{
    {Sm90ItemDeal::kAuto, "auto"}, {Sm90ItemDeal::kStatic, "static"},
    {Sm90ItemDeal::kDynamic, "dynamic"}}};
constexpr NameList<Sm90QueryTile, 3> kQueryTileNames = {{
    {Sm90QueryTile::kAuto, "auto"}, {Sm90QueryTile::k128, "128"}, {Sm90QueryTile::k192, "192"}}};
constexpr NameList<Sm90KeyTile, 3> kKeyTileNames = {{
    {Sm90KeyTile::kAuto, "auto"}, {Sm90KeyTile::k128, "128"}, {Sm90KeyTile::k176, "176"}}};
constexpr NameList<Sm90Cluster, 3> kClusterNames = {{
    {Sm90Cluster::kAuto, "auto"}, {Sm90Cluster::k1, "1"}, {Sm90Cluster::k2, "2"}}};

}  // namespace

std::string_view AttentionEngineName(AttentionEngine engine) {
  return NameIn(kEngineNames, engine);
}

std::string_view FlashKernelArchName(FlashKernelArch arch) { return NameIn(kArchNames, arch); }

std::string_view Sm90ScheduleName(Sm90Schedule schedule) {
  switch (schedule) {
    case Sm90Schedule::kPersistent:
      return "persistent";
  }
  return "persistent";
}

std::string_view Sm90ItemOrderName(Sm90ItemOrder order) { return NameIn(kItemOrderNames, order); }

std::string_view Sm90ItemDealName(Sm90ItemDeal deal) { return NameIn(kItemDealNames, deal); }

std::string_view Sm90QueryTileName(Sm90QueryTile tile) { return NameIn(kQueryTileNames, tile); }

std::string_view Sm90KeyTileName(Sm90KeyTile tile) { return NameIn(kKeyTileNames, tile); }

std::string_view Sm90ClusterName(Sm90Cluster cluster) { return NameIn(kClusterNames, cluster); }

absl::StatusOr<AttentionEngine> ParseAttentionEngine(std::string_view name, std::string_view what) {
  return ParseIn(kEngineNames, name, what);
}

absl::StatusOr<FlashKernelArch> ParseFlashKernelArch(std::string_view name, std::string_view what) {
  return ParseIn(kArchNames, name, what);
}

absl::StatusOr<Sm90Schedule> ParseSm90Schedule(std::string_view name, std::string_view what) {
  // v3: the name ATTNSERVE_SM90_VARIANT, bench scripts and result files use. The removed
  // schedules' names (single_tile / v1, warp_specialized / v2) are refused like any unknown one,
  // so that a script asking for them fails instead of silently measuring another kernel.
  if (name == "persistent" || name == "v3") return Sm90Schedule::kPersistent;
  return Invalid(what, "persistent (or v3; single_tile / v1 and v2 were removed)", name);
}

absl::StatusOr<Sm90ItemDeal> ParseSm90ItemDeal(std::string_view name, std::string_view what) {
  return ParseIn(kItemDealNames, name, what);
}

absl::StatusOr<Sm90ItemOrder> ParseSm90ItemOrder(std::string_view name, std::string_view what) {
  return ParseIn(kItemOrderNames, name, what);
}

absl::StatusOr<Sm90QueryTile> ParseSm90QueryTile(std::string_view name, std::string_view what) {
  return ParseIn(kQueryTileNames, name, what);
}

absl::StatusOr<Sm90KeyTile> ParseSm90KeyTile(std::string_view name, std::string_view what) {
  return ParseIn(kKeyTileNames, name, what);
}

absl::StatusOr<Sm90Cluster> ParseSm90Cluster(std::string_view name, std::string_view what) {
  return ParseIn(kClusterNames, name, what);
}

absl::StatusOr<CudaOptions> CudaOptionsFromEnv(CudaOptions base) {
  CudaOptions options = base;
  if (std::string_view v = EnvValue(kEngineEnv); !v.empty()) {
    ATTN_ASSIGN_OR_RETURN(options.engine, ParseAttentionEngine(v, kEngineEnv));
  }
  if (std::string_view v = EnvValue(kFlashKernelEnv); !v.empty()) {
    ATTN_ASSIGN_OR_RETURN(options.flash.arch, ParseFlashKernelArch(v, kFlashKernelEnv));
  }
  if (std::string_view v = EnvValue(kSm90VariantEnv); !v.empty()) {
    ATTN_ASSIGN_OR_RETURN(options.flash.sm90_schedule, ParseSm90Schedule(v, kSm90VariantEnv));
  }
  if (std::string_view v = EnvValue(kSm90MaxCtasEnv); !v.empty()) {
    // 0 means no cap, as the default.
    int ctas = 0;
    if (!absl::SimpleAtoi(std::string(v), &ctas) || ctas < 0) {
      return Invalid(kSm90MaxCtasEnv, "a CTA count >= 0", v);
    }
    options.flash.persistent_max_ctas = ctas;
  }
  if (std::string_view v = EnvValue(kSm90OrderEnv); !v.empty()) {
    ATTN_ASSIGN_OR_RETURN(options.flash.item_order, ParseSm90ItemOrder(v, kSm90OrderEnv));
  }
  if (std::string_view v = EnvValue(kSm90ItemDealEnv); !v.empty()) {
    ATTN_ASSIGN_OR_RETURN(options.flash.sm90_item_deal, ParseSm90ItemDeal(v, kSm90ItemDealEnv));
  }
  return options;
}

}  // namespace attnserve
