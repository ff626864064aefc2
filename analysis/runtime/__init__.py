"""How an analysis runs: models and their data as subjects (`features`), the
cost of each tool priced before it runs (`estimate`), the plan that fits the
tools into a time budget (`planning`) and progress lines (`progress`)."""
