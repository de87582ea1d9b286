#include "coordinator/move_progress.h"

#include <memory>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(MoveProgressBoardTest, ATrackedMoveReportsItsBytesClampedToItsTotal) {
  MoveProgressBoard board;
  EXPECT_FALSE(board.Progress("w").running);
  auto tally = std::make_shared<MoveTally>();
  tally->total = 100;
  board.Track({"w", "b"}, tally);
  tally->done = 40;
  MoveProgress p = board.Progress("b");
  EXPECT_TRUE(p.running);
  EXPECT_EQ(p.bytes_total, 100);
  EXPECT_EQ(p.bytes_done, 40);
  tally->done = 130;  // a step counted twice is never shown past the end
  EXPECT_EQ(board.Progress("w").bytes_done, 100);
  tally->done = -5;  // a failed step took its bytes back first
  EXPECT_EQ(board.Progress("w").bytes_done, 0);
  board.Untrack({"w", "b"}, tally);
  EXPECT_FALSE(board.Progress("w").running);
  EXPECT_FALSE(board.Progress("b").running);
}

TEST(MoveProgressBoardTest,
     AMoveNeverEndsOrOverwritesAnothersCountButAReshardReplacesIt) {
  MoveProgressBoard board;
  auto first = std::make_shared<MoveTally>();
  first->total = 10;
  auto second = std::make_shared<MoveTally>();
  second->total = 20;
  board.Track({"w"}, first);
  board.Track({"w"}, second);  // a load of a taken name: the first counts on
  EXPECT_EQ(board.Progress("w").bytes_total, 10);
  board.Untrack({"w"}, second);  // not its count: left alone
  EXPECT_EQ(board.Progress("w").bytes_total, 10);
  board.Replace("w", second);
  EXPECT_EQ(board.Progress("w").bytes_total, 20);
  board.Untrack({"w"}, first);
  EXPECT_TRUE(board.Progress("w").running);
  board.Untrack({"w"}, second);
  EXPECT_FALSE(board.Progress("w").running);
}

}  // namespace
}  // namespace tessera
