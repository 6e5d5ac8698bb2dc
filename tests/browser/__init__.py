"""Browser tests: Playwright (Chromium) against a real `threadline serve` process."""
