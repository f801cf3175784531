#include "core/cuda/cuda_options.h"

#include <cstdlib>
#include <string>

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

}  // namespace

std::string_view AttentionEngineName(AttentionEngine engine) {
  switch (engine) {
    case AttentionEngine::kAuto:
      return "auto";
    case AttentionEngine::kOwn:
      return "own";
    case AttentionEngine::kCudnn:
      return "cudnn";
  }
  return "auto";
}

std::string_view FlashKernelArchName(FlashKernelArch arch) {
  switch (arch) {
    case FlashKernelArch::kAuto:
      return "auto";
    case FlashKernelArch::kSm80:
      return "sm80";
    case FlashKernelArch::kSm90:
      return "sm90";
  }
  return "auto";
}

std::string_view Sm90ScheduleName(Sm90Schedule schedule) {
  switch (schedule) {
    case Sm90Schedule::kPersistent:
      return "persistent";
  }
  return "persistent";
}

std::string_view Sm90ItemOrderName(Sm90ItemOrder order) {
  switch (order) {
    case Sm90ItemOrder::kAuto:
      return "auto";
    case Sm90ItemOrder::kPosition:
      return "position";
    case Sm90ItemOrder::kHead:
      return "head";
  }
  return "auto";
}

// Empty names parse as "auto" where there is one: an empty flag or variable means the default.
absl::StatusOr<AttentionEngine> ParseAttentionEngine(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return AttentionEngine::kAuto;
  if (name == "own") return AttentionEngine::kOwn;
  if (name == "cudnn") return AttentionEngine::kCudnn;
  return Invalid(what, "auto, own or cudnn", name);
}

absl::StatusOr<FlashKernelArch> ParseFlashKernelArch(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return FlashKernelArch::kAuto;
  if (name == "sm80") return FlashKernelArch::kSm80;
  if (name == "sm90") return FlashKernelArch::kSm90;
  return Invalid(what, "auto, sm80 or sm90", name);
}

absl::StatusOr<Sm90Schedule> ParseSm90Schedule(std::string_view name, std::string_view what) {
  // v3: the name ATTNSERVE_SM90_VARIANT, bench scripts and result files use. The removed
  // schedules' names (single_tile / v1, warp_specialized / v2) are refused like any unknown one,
  // so that a script asking for them fails instead of silently measuring another kernel.
  if (name == "persistent" || name == "v3") return Sm90Schedule::kPersistent;
  return Invalid(what, "persistent (or v3; single_tile / v1 and v2 were removed)", name);
}

std::string_view Sm90ItemDealName(Sm90ItemDeal deal) {
  switch (deal) {
    case Sm90ItemDeal::kAuto:
      return "auto";
    case Sm90ItemDeal::kStatic:
      return "static";
    case Sm90ItemDeal::kDynamic:
      return "dynamic";
  }
  return "auto";
}

absl::StatusOr<Sm90ItemDeal> ParseSm90ItemDeal(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return Sm90ItemDeal::kAuto;
  if (name == "static") return Sm90ItemDeal::kStatic;
  if (name == "dynamic") return Sm90ItemDeal::kDynamic;
  return Invalid(what, "auto, static or dynamic", name);
}

absl::StatusOr<Sm90ItemOrder> ParseSm90ItemOrder(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return Sm90ItemOrder::kAuto;
  if (name == "position") return Sm90ItemOrder::kPosition;
  if (name == "head") return Sm90ItemOrder::kHead;
  return Invalid(what, "auto, position or head", name);
}

std::string_view Sm90QueryTileName(Sm90QueryTile tile) {
  switch (tile) {
    case Sm90QueryTile::kAuto:
      return "auto";
    case Sm90QueryTile::k128:
      return "128";
    case Sm90QueryTile::k192:
      return "192";
  }
  return "auto";
}

absl::StatusOr<Sm90QueryTile> ParseSm90QueryTile(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return Sm90QueryTile::kAuto;
  if (name == "128") return Sm90QueryTile::k128;
  if (name == "192") return Sm90QueryTile::k192;
  return Invalid(what, "auto, 128 or 192", name);
}

std::string_view Sm90KeyTileName(Sm90KeyTile tile) {
  switch (tile) {
    case Sm90KeyTile::kAuto:
      return "auto";
    case Sm90KeyTile::k128:
      return "128";
    case Sm90KeyTile::k176:
      return "176";
  }
  return "auto";
}

absl::StatusOr<Sm90KeyTile> ParseSm90KeyTile(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return Sm90KeyTile::kAuto;
  if (name == "128") return Sm90KeyTile::k128;
  if (name == "176") return Sm90KeyTile::k176;
  return Invalid(what, "auto, 128 or 176", name);
}

std::string_view Sm90ClusterName(Sm90Cluster cluster) {
  switch (cluster) {
    case Sm90Cluster::kAuto:
      return "auto";
    case Sm90Cluster::k1:
      return "1";
    case Sm90Cluster::k2:
      return "2";
  }
  return "auto";
}

absl::StatusOr<Sm90Cluster> ParseSm90Cluster(std::string_view name, std::string_view what) {
  if (name.empty() || name == "auto") return Sm90Cluster::kAuto;
  if (name == "1") return Sm90Cluster::k1;
  if (name == "2") return Sm90Cluster::k2;
  return Invalid(what, "auto, 1 or 2", name);
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
