module config-snapshot.io/e2e/attack

go 1.26
