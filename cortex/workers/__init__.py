"""Workers: registry, health probing, load polling, circuit breaker."""
