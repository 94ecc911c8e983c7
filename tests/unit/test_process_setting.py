"""
Tests for L{malamute_pack.process_setting}: a process-wide setting held by
services keeps the holders' value until the last lets go, which puts back
what the first found.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.process_setting import ProcessSetting


class ProcessSettingTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.value = "found"
        self.writes: list[str] = []
        self.setting = ProcessSetting[str](lambda: self.value, self.write)

    def write(self, value: str) -> None:
        self.value = value
        self.writes.append(value)

    def test_holdAppliesReleaseRestores(self) -> None:
        """One holder applies its value and, letting go, puts back what it found."""
        self.setting.hold("held")
        self.assertEqual((self.value, self.setting.holders), ("held", 1))
        self.setting.release()
        self.assertEqual((self.value, self.setting.holders), ("found", 0))

    def test_lastToReleaseRestores(self) -> None:
        """
        With two holders the value stays held when the first lets go; the
        last puts back what was there before the first held it, not the
        held value the second found.
        """
        self.setting.hold("held")
        self.setting.hold("held")
        self.setting.release()
        self.assertEqual(self.value, "held")
        self.setting.release()
        self.assertEqual(self.value, "found")
        self.assertEqual(self.writes, ["held", "held", "found"])

    def test_heldAgainSavesAgain(self) -> None:
        """Once nobody holds it, the next holder saves the setting as it is then."""
        self.setting.hold("held")
        self.setting.release()
        self.value = "changed meanwhile"
        self.setting.hold("held")
        self.setting.release()
        self.assertEqual(self.value, "changed meanwhile")

    def test_releaseUnheldRefused(self) -> None:
        """Letting go of a setting nobody holds is a bug, and says so; nothing is written."""
        with self.assertRaises(RuntimeError):
            self.setting.release()
        self.assertEqual(self.writes, [])

    def test_applyWhileHeld(self) -> None:
        """A holder can apply another value while it holds; letting go still restores."""
        self.setting.hold("held")
        self.setting.apply("busy")
        self.assertEqual(self.value, "busy")
        self.setting.release()
        self.assertEqual(self.value, "found")

    def test_applyUnheldRefused(self) -> None:
        """Applying a setting nobody holds is a bug, and says so; nothing is written."""
        with self.assertRaises(RuntimeError):
            self.setting.apply("busy")
        self.assertEqual(self.writes, [])
