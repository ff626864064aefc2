"""The command, `python -m analysis`: the request its flags make (`request`), the
run of it (`command`), the models it names (`loading`), the plan that fits its tools
into a time budget (`planning`), the output folder's lock, claim and manifest
(`out_folder`) and the report of the folder (`report`). The floor above the tools:
nothing below imports it."""
