// Warmup-stable-decay schedules and stages with their own schedule, checked
// at chosen steps against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/lr_schedule.h"

namespace roformer::optim {
namespace {

ScheduleSpec wsd(int64_t warmup, DecayShape shape, double fraction, double floor = 0.0) {
  ScheduleSpec s;
  s.kind = DecayKind::wsd;
  s.warmup_steps = warmup;
  s.decay_shape = shape;
  s.decay_fraction = fraction;
  s.min_lr_ratio = floor;
  return s;
}

TEST(WsdSchedule, WarmupHoldThenLinearDecayToTheFloor) {
  // 10 warm-up steps, 90 after; the last 20% (18 steps) decay.
  const LrSchedule s(wsd(10, DecayShape::linear, 0.2, 0.1), 2.0, {StageLr(100)});
  EXPECT_DOUBLE_EQ(s.at(0), 2.0 * 1 / 10);
  EXPECT_DOUBLE_EQ(s.at(9), 2.0);
  EXPECT_DOUBLE_EQ(s.at(10), 2.0);
  EXPECT_DOUBLE_EQ(s.at(81), 2.0);                         // last stable step (10 + 72 - 1)
  EXPECT_DOUBLE_EQ(s.at(82), 2.0 * (1 - 0.9 * 1.0 / 18));  // first decay step
  EXPECT_DOUBLE_EQ(s.at(90), 2.0 * (1 - 0.9 * 9.0 / 18));  // half way down
  EXPECT_DOUBLE_EQ(s.at(99), 2.0 * 0.1);                   // the floor at the last step
  EXPECT_DOUBLE_EQ(s.at(150), 2.0 * 0.1);                  // and after it
}

TEST(WsdSchedule, CosineAndOneMinusSqrtShapes) {
  const LrSchedule cosine(wsd(0, DecayShape::cosine, 0.5), 1.0, {StageLr(40)});
  EXPECT_DOUBLE_EQ(cosine.at(19), 1.0);
  EXPECT_NEAR(cosine.at(29), 0.5 * (1 + std::cos(M_PI * 10.0 / 20)), 1e-15);  // = 0.5
  EXPECT_NEAR(cosine.at(39), 0.0, 1e-15);
  const LrSchedule sqrt_decay(wsd(0, DecayShape::one_minus_sqrt, 0.25), 1.0, {StageLr(100)});
  EXPECT_DOUBLE_EQ(sqrt_decay.at(74), 1.0);
  EXPECT_DOUBLE_EQ(sqrt_decay.at(75), 1.0 - std::sqrt(1.0 / 25));  // 0.8
  EXPECT_DOUBLE_EQ(sqrt_decay.at(80), 1.0 - std::sqrt(6.0 / 25));
  EXPECT_DOUBLE_EQ(sqrt_decay.at(99), 0.0);
}

TEST(WsdSchedule, DecayStepsOverrideTheFraction) {
  ScheduleSpec spec = wsd(0, DecayShape::linear, 0.9);
  spec.decay_steps = 4;
  const LrSchedule s(spec, 1.0, {StageLr(10)});
  EXPECT_DOUBLE_EQ(s.at(5), 1.0);
  EXPECT_DOUBLE_EQ(s.at(6), 0.75);
  EXPECT_DOUBLE_EQ(s.at(9), 0.0);
}

TEST(StageSchedule, AStageRunsItsOwnScheduleOverItsOwnSteps) {
  // Stage 1 follows the run's linear decay over all 30 steps; stage 2 (its
  // own peak 0.5) warms up over 2 steps, holds, and decays its last 4.
  ScheduleSpec own = wsd(2, DecayShape::linear, 0.5);
  const LrSchedule s(ScheduleSpec::simple(DecayKind::linear, 0, 0.0), 1.0,
                     {StageLr(10), StageLr(10, 0.5, {}, own), StageLr(10)});
  EXPECT_DOUBLE_EQ(s.at(5), 1.0 - 5.0 / 30);
  EXPECT_DOUBLE_EQ(s.at(10), 0.5 * 0.5);  // warm-up step 1 of 2
  EXPECT_DOUBLE_EQ(s.at(11), 0.5);
  EXPECT_DOUBLE_EQ(s.at(15), 0.5);  // 8 steps after warm-up: 4 stable
  EXPECT_DOUBLE_EQ(s.at(16), 0.5 * 0.75);
  EXPECT_DOUBLE_EQ(s.at(19), 0.0);
  EXPECT_DOUBLE_EQ(s.at(20), 1.0 - 20.0 / 30);  // stage 3 is back on the run's schedule
}

TEST(ScheduleNames, ParseAndPrint) {
  EXPECT_EQ(parse_decay_kind("wsd"), DecayKind::wsd);
  EXPECT_EQ(decay_kind_name(DecayKind::cosine), "cosine");
  EXPECT_EQ(parse_decay_shape("1-sqrt"), DecayShape::one_minus_sqrt);
  EXPECT_EQ(decay_shape_name(DecayShape::one_minus_sqrt), "1-sqrt");
  EXPECT_THROW(parse_decay_shape("sqrt"), InputError);
}

}  // namespace
}  // namespace roformer::optim
